"""Errors of the embedded NATS infrastructure.

::

    NatsInfraError                 anything below; catch this at an entry point
    ├── TlsMaterialError           the CA directory is half there (a cert without its key)
    └── NatsServerError            the nats-server process could not be used
        ├── BinaryNotFoundError    no nats-server on PATH nor in the venv
        ├── ServerStartError       exited or never became ready; carries the log tail
        └── ReloadError            SIGHUP was not applied (bad config or server gone)

Invalid site names are refused with :class:`lodestream.schemas.errors.SubjectError`, the
same error every other layer raises for them.
"""

from __future__ import annotations


class NatsInfraError(Exception):
    """Base of the errors raised by ``lodestream.infra.nats``."""


class TlsMaterialError(NatsInfraError):
    """TLS files on disk are inconsistent and must not be silently replaced."""


class NatsServerError(NatsInfraError):
    """The nats-server process could not be started, reloaded or reached."""


class BinaryNotFoundError(NatsServerError):
    """No nats-server binary was found."""


class ServerStartError(NatsServerError):
    """nats-server exited during start-up or did not become ready in time."""


class ReloadError(NatsServerError):
    """nats-server did not apply a configuration reload."""
