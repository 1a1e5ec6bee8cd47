"""Run the read-model migrations programmatically, from any working directory.

``upgrade``/``downgrade``/``current`` take a plain libpq URL
(``postgresql://…``, what settings and fixtures hand around) or a SQLAlchemy
one (``postgresql+psycopg://…``). The alembic :class:`Config` is built here
with an absolute ``script_location``; ``alembic.ini`` beside this file is for
the alembic command line only.

Concurrent upgrades (several services starting at once) are serialised by a
transaction-level advisory lock taken in ``env.py``; all of a run's DDL is one
transaction, so a failed upgrade leaves nothing half-applied.

Migrations run with an empty ``search_path``: every name in them is
schema-qualified, and Postgres then qualifies every name it reports back
too, so reflection sees ``public.users`` exactly as ``tables.py`` spells it
(with ``public`` on the path, a foreign key to it reflects as a bare
``users`` and shows up as a spurious difference).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, make_url, pool

from lodestream.infra.postgres.tables import READ_SCHEMA, metadata

MIGRATIONS_DIR: Final = Path(__file__).resolve().with_name("migrations")
VERSION_TABLE_SCHEMA: Final = "public"
VERSION_TABLE: Final = "alembic_version"
# pg_advisory_xact_lock key: the ASCII bytes of "lodemigr".
MIGRATION_LOCK_KEY: Final = 0x6C6F_6465_6D69_6772
# Schemas the migrations own; anything else in the database is not ours to compare.
MANAGED_SCHEMAS: Final = frozenset({VERSION_TABLE_SCHEMA, READ_SCHEMA})

_DRIVER: Final = "postgresql+psycopg"


def sqlalchemy_url(database_url: str) -> str:
    """``database_url`` with the psycopg 3 driver that SQLAlchemy should use."""
    url = make_url(database_url)
    if url.drivername not in {"postgresql", "postgres", _DRIVER}:
        raise ValueError(f"not a PostgreSQL URL for psycopg 3: {url.drivername}://…")
    return url.set(drivername=_DRIVER).render_as_string(hide_password=False)


def alembic_config(database_url: str | None = None) -> Config:
    """An alembic config for ``migrations/``; ``database_url`` becomes ``sqlalchemy.url``."""
    config = Config()
    # Config options go through ConfigParser interpolation: a literal % must be doubled.
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    if database_url is not None:
        escaped = sqlalchemy_url(database_url).replace("%", "%%")
        config.set_main_option("sqlalchemy.url", escaped)
    return config


def migration_engine(database_url: str) -> Engine:
    """An engine for migrations and schema checks: no pooling, empty ``search_path``."""
    # NullPool: no connection may linger, or CREATE DATABASE … TEMPLATE on this
    # database would fail with "source database is being accessed by other users".
    return create_engine(
        sqlalchemy_url(database_url),
        poolclass=pool.NullPool,
        connect_args={"options": "-c search_path="},
    )


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    """Autogenerate filter: only our schemas, and never alembic's own version table."""
    if type_ == "schema":
        # None is the default schema: none under our empty search_path, public otherwise.
        return name is None or name in MANAGED_SCHEMAS
    if type_ == "table":
        return name != VERSION_TABLE
    return True


def upgrade(database_url: str, revision: str = "head") -> None:
    """Migrate the database up to ``revision``."""
    _with_connection(database_url, lambda config: command.upgrade(config, revision))


def downgrade(database_url: str, revision: str = "base") -> None:
    """Migrate the database down to ``revision`` (``base``: drop everything we created)."""
    _with_connection(database_url, lambda config: command.downgrade(config, revision))


def current(database_url: str) -> str | None:
    """The revision the database is at, or None if it was never migrated."""
    engine = migration_engine(database_url)
    try:
        with engine.connect() as connection:
            return _context(connection).get_current_revision()
    finally:
        engine.dispose()


def schema_diff(database_url: str) -> list[Any]:
    """Differences between the live schema and ``tables.metadata`` (empty when in sync).

    Alembic's comparison: tables, columns, types, nullability, server defaults,
    indexes (columns, order, uniqueness), unique and foreign-key constraints.
    It does not compare an index's access method or operator classes.
    """
    engine = migration_engine(database_url)
    try:
        with engine.connect() as connection:
            return list(compare_metadata(_context(connection), metadata))
    finally:
        engine.dispose()


def head() -> str | None:
    """The newest revision in ``migrations/versions``."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def _context(connection: Connection) -> MigrationContext:
    return MigrationContext.configure(
        connection,
        opts={
            "version_table": VERSION_TABLE,
            "version_table_schema": VERSION_TABLE_SCHEMA,
            "include_schemas": True,
            "include_name": include_name,
            "compare_type": True,
            "compare_server_default": True,
        },
    )


def _with_connection(database_url: str, run: Callable[[Config], None]) -> None:
    engine = migration_engine(database_url)
    try:
        with engine.begin() as connection:
            run(_config_for(connection))
    finally:
        engine.dispose()


def _config_for(connection: Connection) -> Config:
    config = alembic_config()
    config.attributes["connection"] = connection
    return config
