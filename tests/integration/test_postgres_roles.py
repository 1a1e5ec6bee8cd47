"""Password authentication and one least-privilege role per service (infra/postgres/roles.py).

One SCRAM server for the module; each test gets its own migrated database
with the roles applied, as ``lode up`` does.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from psycopg import errors as pg_errors
from psycopg import sql

import lodestream.infra.postgres
from lodestream.infra.postgres.migrate import upgrade
from lodestream.infra.postgres.roles import API, CONTROLLER, PROJECTOR, SERVICE_ROLES, apply_roles
from lodestream.infra.postgres.server import EmbeddedPostgres, set_password
from lodestream.services.projector.rebuild import create_rebuild_schema, index_rebuild_schema
from tests.fixtures.postgres import FAST_SETTINGS, postgres_tempdir, start_server

TEMPLATE = "roles_template"
PASSWORDS = {role: f"pw-{role}-{uuid.uuid4().hex}" for role in SERVICE_ROLES}
_numbers = itertools.count()


@dataclass(frozen=True)
class Database:
    server: EmbeddedPostgres
    name: str

    def url(self, role: str | None = None, password: str | None = None) -> str:
        if role is None:
            return self.server.url(self.name)
        return self.server.url(self.name, user=role, password=password or PASSWORDS[role])

    def connect(self, role: str | None = None) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.url(role), autocommit=True)


@pytest.fixture(scope="module")
def scram_server() -> Iterator[EmbeddedPostgres]:
    with postgres_tempdir() as base:
        server = start_server(base / "data", FAST_SETTINGS, password=uuid.uuid4().hex)
        try:
            server.create_database(TEMPLATE)
            upgrade(server.url(TEMPLATE))
            yield server
        finally:
            server.stop()


@pytest.fixture
def db(scram_server: EmbeddedPostgres) -> Database:
    name = f"roles_{next(_numbers)}"
    scram_server.create_database(name, template=TEMPLATE, strategy="file_copy")
    apply_roles(scram_server.url(name), name, PASSWORDS)
    return Database(scram_server, name)


def _insert_job(conn: psycopg.Connection[tuple[object, ...]], schema: str = "rm") -> None:
    now = datetime.now(UTC)
    statement = sql.SQL(
        "INSERT INTO {}.jobs (id, site, owner, app, state, workdir, parameters, tags, data, "
        "resources, transfers, parent_ids, created_seq, last_seq, created_at, updated_at, "
        "stage_times) VALUES (%s, 's', 'ada', 'app', 'CREATED', 'w', '{{}}', '{{}}', '{{}}', "
        "'{{}}', '[]', '{{}}', 1, 1, %s, %s, '{{}}')"
    ).format(sql.Identifier(schema))
    conn.execute(statement, (uuid.uuid4(), now, now))


def test_a_connection_without_the_right_password_is_refused(db: Database) -> None:
    with pytest.raises(psycopg.OperationalError, match="no password supplied"):
        psycopg.connect(db.server.url(db.name, password=""))
    for role in ("postgres", *SERVICE_ROLES):
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(db.url(role, password="wrong"))
    with db.connect(API) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (API,)


def test_the_api_reads_the_read_models_and_writes_only_its_auth_tables(db: Database) -> None:
    with db.connect(API) as conn:
        assert conn.execute("SELECT count(*) FROM rm.jobs").fetchone() == (0,)
        conn.execute("INSERT INTO public.users (name, created_at) VALUES ('ada', now())")
        conn.execute(
            "INSERT INTO public.api_tokens (token_hash, user_name, created_at) "
            "VALUES ('h', 'ada', now())"
        )
        conn.execute("UPDATE public.api_tokens SET revoked_at = now()")
        with pytest.raises(pg_errors.InsufficientPrivilege):
            _insert_job(conn)
        with pytest.raises(pg_errors.InsufficientPrivilege):
            conn.execute("DELETE FROM rm.sites")
        with pytest.raises(pg_errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE rm.mine (x int)")
        with pytest.raises(pg_errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE public.mine (x int)")


def test_the_controller_only_reads_the_read_models(db: Database) -> None:
    with db.connect(CONTROLLER) as conn:
        assert conn.execute("SELECT count(*) FROM rm.projector_position").fetchone() == (0,)
        with pytest.raises(pg_errors.InsufficientPrivilege):
            _insert_job(conn)
        with pytest.raises(pg_errors.InsufficientPrivilege):
            conn.execute("UPDATE rm.projector_position SET seq = 0")
        with pytest.raises(pg_errors.InsufficientPrivilege):
            conn.execute("SELECT count(*) FROM public.users")


def test_the_projector_writes_the_read_models_but_not_the_auth_tables(db: Database) -> None:
    with db.connect(PROJECTOR) as conn:
        _insert_job(conn)
        conn.execute(
            "INSERT INTO rm.projector_position (stream, seq, updated_at) "
            "VALUES ('EVENTS', 1, now())"
        )
        # Each batch stages progress in a temp table.
        conn.execute("CREATE TEMP TABLE staging (id uuid)")
        with pytest.raises(pg_errors.InsufficientPrivilege):
            conn.execute("SELECT count(*) FROM public.api_tokens")
        with pytest.raises(pg_errors.InsufficientPrivilege):
            conn.execute("INSERT INTO public.users (name, created_at) VALUES ('eve', now())")


def test_the_projector_can_rebuild_and_the_readers_still_read(db: Database) -> None:
    # What services/projector/rebuild.py does, as the projector's role.
    create_rebuild_schema(db.url(PROJECTOR))
    with db.connect(PROJECTOR) as conn:
        _insert_job(conn, "rm_rebuild")
    index_rebuild_schema(db.url(PROJECTOR))  # after the bulk load, as the projector's role
    with db.connect(PROJECTOR) as conn, conn.transaction():
        conn.execute("ALTER SCHEMA rm RENAME TO rm_retired")
        conn.execute("ALTER SCHEMA rm_rebuild RENAME TO rm")
        conn.execute("DROP SCHEMA rm_retired CASCADE")

    for role in (API, CONTROLLER):
        with db.connect(role) as conn:
            assert conn.execute("SELECT count(*) FROM rm.jobs").fetchone() == (1,)
            with pytest.raises(pg_errors.InsufficientPrivilege):
                _insert_job(conn)


@pytest.mark.parametrize("role", SERVICE_ROLES)
def test_only_the_superuser_may_drop_the_database(db: Database, role: str) -> None:
    with db.connect(role) as conn, pytest.raises(pg_errors.InsufficientPrivilege):
        conn.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(db.name)))
    with db.connect(role) as conn, pytest.raises(pg_errors.InsufficientPrivilege):
        conn.execute("CREATE DATABASE mine")
    with db.connect(role) as conn, pytest.raises(pg_errors.InsufficientPrivilege):
        conn.execute("CREATE ROLE mine")

    db.server.drop_database(db.name)


def test_apply_roles_is_idempotent_and_hands_new_tables_over(db: Database) -> None:
    # A later migration, run by the superuser, adds a read-model table.
    with db.connect() as conn:
        conn.execute("CREATE TABLE rm.added (x int)")
    apply_roles(db.url(), db.name, PASSWORDS)
    apply_roles(db.url(), db.name, PASSWORDS)

    with db.connect(PROJECTOR) as conn:
        conn.execute("INSERT INTO rm.added VALUES (1)")
    with db.connect(CONTROLLER) as conn:
        assert conn.execute("SELECT x FROM rm.added").fetchall() == [(1,)]
    with db.connect() as conn:
        owners = conn.execute(
            "SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'rm'"
        ).fetchall()
    assert owners == [(PROJECTOR,)]


def test_a_new_password_takes_effect(db: Database) -> None:
    changed = {**PASSWORDS, API: "a-new-one"}
    apply_roles(db.url(), db.name, changed)
    try:
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(db.url(API))
        psycopg.connect(db.url(API, password="a-new-one")).close()
    finally:
        apply_roles(db.url(), db.name, PASSWORDS)


def test_roles_sql_gives_a_managed_postgres_the_same_model(
    scram_server: EmbeddedPostgres,
) -> None:
    script = (Path(lodestream.infra.postgres.__file__).parent / "roles.sql").read_text()
    scram_server.create_database("lodestream")
    try:
        with psycopg.connect(scram_server.url("lodestream"), autocommit=True) as conn:
            conn.execute(script.encode())  # no parameters: one simple query, many statements
            for role in SERVICE_ROLES:  # "replace the passwords", as the script asks
                set_password(conn, role, PASSWORDS[role])
        migrator = scram_server.url("lodestream", user="lode_migrator", password="change-me")
        upgrade(migrator)
        with psycopg.connect(scram_server.url("lodestream"), autocommit=True) as conn:
            conn.execute(script.encode())  # the "after every migration" part

        db = Database(scram_server, "lodestream")
        with db.connect(PROJECTOR) as conn:
            _insert_job(conn)
        with db.connect(CONTROLLER) as conn:
            assert conn.execute("SELECT count(*) FROM rm.jobs").fetchone() == (1,)
            with pytest.raises(pg_errors.InsufficientPrivilege):
                conn.execute("SELECT count(*) FROM public.users")
        with db.connect(API) as conn:
            conn.execute("INSERT INTO public.users (name, created_at) VALUES ('ada', now())")
            with pytest.raises(pg_errors.InsufficientPrivilege):
                _insert_job(conn)
    finally:
        scram_server.drop_database("lodestream")
        # Roles are cluster-wide: the others' passwords must stay what the fixtures expect.
        with psycopg.connect(scram_server.url(TEMPLATE), autocommit=True) as conn:
            for role in ("lode_migrator", "lode_owner"):
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
