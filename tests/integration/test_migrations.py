"""The migrations build exactly ``lodestream.infra.postgres.tables``, and tear it down again."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import Engine, text

from lodestream.infra.postgres import migrate
from lodestream.infra.postgres.server import EmbeddedPostgres
from lodestream.infra.postgres.tables import metadata

_numbers = itertools.count()

# Per index: access method and the operator classes that are not the column type's default.
_INDEX_METHODS = text(
    """
    SELECT n.nspname, c.relname, am.amname,
           array_agg(CASE WHEN opc.opcdefault THEN '' ELSE opc.opcname END ORDER BY k.n)
    FROM pg_index ix
    JOIN pg_class c ON c.oid = ix.indexrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    JOIN pg_am am ON am.oid = c.relam
    CROSS JOIN LATERAL unnest(ix.indclass::oid[]) WITH ORDINALITY AS k(opclass, n)
    JOIN pg_opclass opc ON opc.oid = k.opclass
    WHERE n.nspname IN ('rm', 'public')
      AND NOT EXISTS (SELECT 1 FROM pg_constraint con WHERE con.conindid = ix.indexrelid)
    GROUP BY n.nspname, c.relname, am.amname
    """
)


@pytest.fixture
def empty_database_url(postgres_server: EmbeddedPostgres) -> Iterator[str]:
    name = f"empty_{next(_numbers)}"
    postgres_server.create_database(name)
    try:
        yield postgres_server.url(name)
    finally:
        postgres_server.drop_database(name)


IndexMethods = dict[tuple[str, str], tuple[str, tuple[str, ...]]]


def _expected_index_methods() -> IndexMethods:
    expected: IndexMethods = {}
    for table in metadata.tables.values():
        assert table.schema is not None
        for index in table.indexes:
            assert isinstance(index.name, str)
            options = index.dialect_options["postgresql"]
            ops = options["ops"] or {}
            expected[(table.schema, index.name)] = (
                options["using"] or "btree",
                tuple(ops.get(column.name, "") for column in index.columns),
            )
    return expected


def _live_index_methods(database_url: str) -> IndexMethods:
    engine = migrate.migration_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(_INDEX_METHODS).all()
    finally:
        engine.dispose()
    return {(schema, name): (method, tuple(ops)) for schema, name, method, ops in rows}


def _relations(database_url: str) -> set[tuple[str, str]]:
    """Every schema and relation (table, index, sequence, …) outside the system schemas."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            """
            SELECT 'schema', nspname FROM pg_namespace
            WHERE nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
            UNION ALL
            SELECT n.nspname, c.relname FROM pg_class c
            JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
            """
        ).fetchall()
    return {(schema, name) for schema, name in rows}


def test_head_matches_tables_metadata(empty_database_url: str) -> None:
    assert migrate.current(empty_database_url) is None

    migrate.upgrade(empty_database_url)

    assert migrate.current(empty_database_url) == migrate.head() == "0007"
    assert migrate.schema_diff(empty_database_url) == []
    # Alembic does not compare access methods and operator classes (GIN, jsonb_path_ops).
    assert _live_index_methods(empty_database_url) == _expected_index_methods()
    assert _expected_index_methods()[("rm", "jobs_tags")] == ("gin", ("jsonb_path_ops",))


def test_schema_diff_detects_drift(empty_database_url: str) -> None:
    """Guards the test above against passing because nothing is compared."""
    migrate.upgrade(empty_database_url)
    with psycopg.connect(empty_database_url) as conn:
        conn.execute("ALTER TABLE rm.jobs ALTER COLUMN site DROP NOT NULL")
        conn.execute("ALTER TABLE rm.apps ALTER COLUMN python SET DEFAULT true")
        conn.execute("DROP INDEX rm.jobs_owner_created")
        conn.execute("CREATE INDEX jobs_owner_created ON rm.jobs (owner, created_seq)")
        conn.execute("DROP INDEX rm.jobs_tags")
        conn.execute("CREATE INDEX jobs_tags ON rm.jobs (tags)")
        conn.execute("ALTER TABLE public.api_tokens DROP CONSTRAINT api_tokens_user_name_fkey")

    kinds = {
        diff[0][0] if isinstance(diff, list) else diff[0]
        for diff in migrate.schema_diff(empty_database_url)
    }

    assert kinds == {"modify_nullable", "modify_default", "remove_index", "add_index", "add_fk"}
    live = _live_index_methods(empty_database_url)
    assert live[("rm", "jobs_tags")] == ("btree", ("",))


def test_downgrade_to_base_removes_everything_and_upgrade_again(empty_database_url: str) -> None:
    before = _relations(empty_database_url)
    migrate.upgrade(empty_database_url)
    assert ("schema", "rm") in _relations(empty_database_url) - before

    migrate.downgrade(empty_database_url, "base")

    assert migrate.current(empty_database_url) is None
    # Only alembic's own (now empty) version table is left of what the upgrade made.
    assert _relations(empty_database_url) - before == {
        ("public", "alembic_version"),
        ("public", "alembic_version_pkc"),
    }

    migrate.upgrade(empty_database_url)
    migrate.upgrade(empty_database_url)  # already at head: nothing to do

    assert migrate.current(empty_database_url) == migrate.head()
    assert migrate.schema_diff(empty_database_url) == []


def test_upgrade_accepts_sqlalchemy_urls(empty_database_url: str) -> None:
    sa_url = migrate.sqlalchemy_url(empty_database_url)
    assert sa_url.startswith("postgresql+psycopg://")
    assert migrate.sqlalchemy_url(sa_url) == sa_url

    migrate.upgrade(sa_url)

    assert migrate.current(empty_database_url) == migrate.head()


def test_sqlalchemy_url_refuses_other_databases() -> None:
    with pytest.raises(ValueError, match="not a PostgreSQL URL"):
        migrate.sqlalchemy_url("sqlite:///lode.db")


def test_each_test_gets_a_migrated_database_of_its_own(
    database_url: str, sa_engine: Engine
) -> None:
    assert migrate.current(database_url) == migrate.head()
    with sa_engine.begin() as conn:
        conn.execute(text("INSERT INTO public.users (name, created_at) VALUES ('ada', now())"))
        assert conn.execute(text("SELECT count(*) FROM rm.jobs")).scalar_one() == 0
        assert conn.execute(text("SELECT current_database()")).scalar_one() != "lode_template"


def test_template_is_left_untouched(postgres_server: EmbeddedPostgres) -> None:
    with psycopg.connect(postgres_server.url("lode_template")) as conn:
        assert conn.execute("SELECT count(*) FROM public.users").fetchone() == (0,)
