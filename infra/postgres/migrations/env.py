"""Alembic environment for the read models (schema ``rm``) and the API's auth tables.

The database comes from, in order: a connection handed over by
:mod:`lodestream.infra.postgres.migrate` (``config.attributes["connection"]``), the
``sqlalchemy.url`` option, or — when run from the alembic command line — the
``DATABASE_URL``/``LODE_DATABASE_URL`` setting. The version table lives in
``public`` so that dropping and rebuilding ``rm`` never loses it. Connections
have an empty ``search_path`` (see :mod:`lodestream.infra.postgres.migrate`): every name
in a migration must be schema-qualified.
"""

from __future__ import annotations

from logging.config import fileConfig
from typing import Any

from alembic import context
from sqlalchemy import Connection, text

from lodestream.infra.postgres.migrate import (
    MIGRATION_LOCK_KEY,
    VERSION_TABLE,
    VERSION_TABLE_SCHEMA,
    include_name,
    migration_engine,
    sqlalchemy_url,
)
from lodestream.infra.postgres.tables import metadata
from lodestream.settings import Settings

config = context.config

if config.config_file_name is not None:
    fileConfig(config.config_file_name)


def _configure(**target: Any) -> None:
    """``context.configure`` with our options; ``target`` is the connection or the URL."""
    context.configure(
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        version_table_schema=VERSION_TABLE_SCHEMA,
        include_schemas=True,
        include_name=include_name,
        compare_server_default=True,
        **target,
    )


def _database_url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    # Reached only from the alembic command line, an entry point: it may read the environment.
    return sqlalchemy_url(Settings().database_url)


def run_migrations_offline() -> None:
    """Emit the SQL instead of running it (``alembic upgrade head --sql``), e.g. for a DBA."""
    _configure(url=_database_url(), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def _run(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        # Held until commit: a second migrator waits here, then finds nothing left to do.
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = migration_engine(_database_url())
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
