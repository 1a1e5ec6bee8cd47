"""One login role per service, each with only the privileges it needs (the embedded stack).

::

    role             may                                              owns
    postgres         everything (superuser): migrations, this module  the database
    lode_projector   write the read models (temp tables included);    schema rm and its tables
                     rebuild them (CREATE SCHEMA rm_rebuild, rename,
                     drop)
    lode_api         read rm; read and write public.users,            —
                     public.api_tokens, public.monitoring_keys and
                     public.bound_keys (its own auth tables); read
                     the credential sync's state
    lode_controller  read rm; read public.monitoring_keys and         —
                     public.bound_keys (the credential sync renders
                     them into nats-server); write the sync's state
                     (public.credential_sync, credential_rejects)

The projector owns ``rm`` because a rebuild (``services/projector/rebuild.py``)
builds a fresh schema and swaps it in with ``ALTER SCHEMA … RENAME``, which
only the owner may do; the read models are derived from the log, so owning
them grants nothing the log cannot restore. Default privileges give the
readers SELECT on whatever schema and tables the projector creates, so the
grants survive a rebuild. Nobody but the superuser owns the database, so
nobody else can drop it.

:func:`apply_roles` is idempotent and runs after every migration: tables a
migration adds (created by the superuser) are handed to the projector and
granted here. A table added to ``public`` for the API needs a line in
:data:`API_TABLES`. ``roles.sql`` is the same model for a managed Postgres.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import psycopg
from psycopg import sql

from lodestream.infra.postgres.server import set_password
from lodestream.infra.postgres.tables import READ_SCHEMA, REBUILD_SCHEMA

API: Final = "lode_api"
PROJECTOR: Final = "lode_projector"
CONTROLLER: Final = "lode_controller"
SERVICE_ROLES: Final = (API, PROJECTOR, CONTROLLER)
READERS: Final = (API, CONTROLLER)
MONITOR_KEYS: Final = "public.monitoring_keys"
BOUND_KEYS: Final = "public.bound_keys"
API_TABLES: Final = ("public.users", "public.api_tokens", MONITOR_KEYS, BOUND_KEYS)
# Written by `lode up`'s credential sync (the controller's login); the API only reads them.
SYNC_TABLES: Final = ("public.credential_sync", "public.credential_rejects")

# Plain and partitioned tables; their indexes and owned sequences follow them.
_TABLE_KINDS: Final = ("r", "p")


def apply_roles(admin_url: str, database: str, passwords: Mapping[str, str]) -> None:
    """Create or update the service roles and their privileges on ``database``.

    ``admin_url`` connects to ``database`` as a superuser; ``passwords`` maps
    each of :data:`SERVICE_ROLES` to its password. One transaction: a failure
    leaves the privileges as they were.
    """
    missing = set(SERVICE_ROLES) - set(passwords)
    if missing:
        raise ValueError(f"no password for {sorted(missing)}")
    with psycopg.connect(admin_url) as conn, conn.transaction():
        for role in SERVICE_ROLES:
            _ensure_login(conn, role, passwords[role])
        _database_privileges(conn, database)
        _hand_read_models_to_projector(conn)
        _reader_privileges(conn)
        conn.execute(
            sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(
                _names(API_TABLES), sql.Identifier(API)
            )
        )
        # Public keys only: what `lode up`'s credential sync (the controller's login) renders.
        conn.execute(
            sql.SQL("GRANT SELECT ON {} TO {}").format(
                _names((MONITOR_KEYS, BOUND_KEYS)), sql.Identifier(CONTROLLER)
            )
        )
        conn.execute(
            sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(
                _names(SYNC_TABLES), sql.Identifier(CONTROLLER)
            )
        )
        conn.execute(
            sql.SQL("GRANT SELECT ON {} TO {}").format(_names(SYNC_TABLES), sql.Identifier(API))
        )


def _ensure_login(conn: psycopg.Connection[Any], role: str, password: str) -> None:
    exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
    if not exists:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    # Also on every start: a role left from an older run must not keep more than this.
    conn.execute(
        sql.SQL(
            "ALTER ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"
        ).format(sql.Identifier(role))
    )
    set_password(conn, role, password)


def _database_privileges(conn: psycopg.Connection[Any], database: str) -> None:
    db = sql.Identifier(database)
    conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(db))
    conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(db, _roles(READERS)))
    # CREATE: a rebuild creates schema rm_rebuild and renames schemas. TEMPORARY: each
    # batch stages job progress in a temp table (services/projector/store.py).
    conn.execute(
        sql.SQL("GRANT CONNECT, CREATE, TEMPORARY ON DATABASE {} TO {}").format(
            db, sql.Identifier(PROJECTOR)
        )
    )
    conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")


def _hand_read_models_to_projector(conn: psycopg.Connection[Any]) -> None:
    projector = sql.Identifier(PROJECTOR)
    schemas = conn.execute(
        "SELECT nspname FROM pg_namespace WHERE nspname = ANY(%s)",
        ([READ_SCHEMA, REBUILD_SCHEMA],),
    ).fetchall()
    for (schema,) in schemas:  # rm_rebuild: a rebuild that failed half-way, to be dropped
        conn.execute(
            sql.SQL("ALTER SCHEMA {} OWNER TO {}").format(sql.Identifier(schema), projector)
        )
    rows = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = ANY(%s) AND c.relkind::text = ANY(%s) "
        "AND pg_get_userbyid(c.relowner) <> %s",
        ([READ_SCHEMA, REBUILD_SCHEMA], list(_TABLE_KINDS), PROJECTOR),
    ).fetchall()
    for schema, name in rows:
        conn.execute(
            sql.SQL("ALTER TABLE {} OWNER TO {}").format(sql.Identifier(schema, name), projector)
        )


def _reader_privileges(conn: psycopg.Connection[Any]) -> None:
    rm, readers = sql.Identifier(READ_SCHEMA), _roles(READERS)
    conn.execute(sql.SQL("REVOKE ALL ON SCHEMA {} FROM PUBLIC").format(rm))
    conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(rm, readers))
    conn.execute(sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(rm, readers))
    # Not IN SCHEMA rm: a rebuild creates rm_rebuild and its tables, then renames it to rm.
    for objects, privilege in (("SCHEMAS", "USAGE"), ("TABLES", "SELECT")):
        conn.execute(
            sql.SQL("ALTER DEFAULT PRIVILEGES FOR ROLE {} GRANT {} ON {} TO {}").format(
                sql.Identifier(PROJECTOR), sql.SQL(privilege), sql.SQL(objects), readers
            )
        )


def _roles(names: tuple[str, ...]) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(name) for name in names)


def _names(qualified: tuple[str, ...]) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(*name.split(".")) for name in qualified)
