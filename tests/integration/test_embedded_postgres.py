"""The embedded Postgres process: start, stop, restart, SIGKILL and crash recovery.

Each test runs its own server (not the session's) in its own directory.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from lodestream.infra.postgres import hba
from lodestream.infra.postgres.errors import AuthenticationError, PostgresStartError
from lodestream.infra.postgres.server import EmbeddedPostgres
from tests.fixtures.ports import free_port
from tests.fixtures.postgres import FAST_SETTINGS, start_server


@pytest.fixture
def server(postgres_dir: Path) -> Iterator[EmbeddedPostgres]:
    server = start_server(postgres_dir / "data", FAST_SETTINGS)
    try:
        yield server
    finally:
        server.stop()


def _exited(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie (exited, never reaped) still answers kill(0).
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _rows(server: EmbeddedPostgres) -> list[tuple[int, str]]:
    with psycopg.connect(server.url()) as conn:
        return conn.execute("SELECT id, note FROM notes ORDER BY id").fetchall()


def test_start_accepts_connections_and_stop_ends_every_process(server: EmbeddedPostgres) -> None:
    pid = server.pid
    assert pid is not None
    with psycopg.connect(server.url()) as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert conn.execute("SHOW fsync").fetchone() == ("off",)
    assert backend is not None
    if os.geteuid() == 0:  # Postgres refuses root: it must run as the unprivileged account
        assert Path(f"/proc/{pid}").stat().st_uid != 0

    server.stop()

    assert server.pid is None
    assert _exited(pid)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(server.url(), connect_timeout=2)


def test_data_survives_stop_and_start(server: EmbeddedPostgres) -> None:
    with psycopg.connect(server.url()) as conn:
        conn.execute("CREATE TABLE notes (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO notes VALUES (1, 'kept')")

    server.stop()
    server.start()

    assert _rows(server) == [(1, "kept")]


def test_sigkill_then_restart_keeps_committed_data(postgres_dir: Path) -> None:
    # Durable settings (fsync on, synchronous commit): what `lode up` runs with.
    server = start_server(postgres_dir / "data")
    try:
        with psycopg.connect(server.url()) as conn:
            assert conn.execute("SHOW fsync").fetchone() == ("on",)
            conn.execute("CREATE TABLE notes (id int PRIMARY KEY, note text)")
            conn.execute("INSERT INTO notes VALUES (1, 'committed')")
        in_flight = psycopg.connect(server.url())
        in_flight.execute("INSERT INTO notes VALUES (2, 'never committed')")
        backend = in_flight.info.backend_pid
        postmaster = server.pid
        assert postmaster is not None

        server.kill()

        assert server.pid is None
        assert _exited(postmaster)
        assert _exited(backend)  # orphaned backends are gone too, not left holding shared memory
        assert (postgres_dir / "data" / "postmaster.pid").exists()  # stale, as after a crash
        with pytest.raises(psycopg.OperationalError):
            in_flight.commit()
        in_flight.close()

        server.start()  # crash recovery replays the WAL

        assert _rows(server) == [(1, "committed")]
        server.kill()
        server.start()  # and again, right after a recovery
        assert _rows(server) == [(1, "committed")]
    finally:
        server.stop()


def test_ensure_initialized_is_idempotent(server: EmbeddedPostgres) -> None:
    version_file = server.data_dir / "PG_VERSION"
    before = version_file.stat().st_mtime_ns
    assert server.create_database("kept") is True

    assert server.ensure_initialized() is False

    assert version_file.stat().st_mtime_ns == before
    assert server.create_database("kept") is False  # still there: nothing was re-created


def test_context_manager_initialises_starts_and_stops(postgres_dir: Path) -> None:
    with EmbeddedPostgres(postgres_dir / "data", free_port(), settings=FAST_SETTINGS) as server:
        pid = server.pid
        assert pid is not None
        assert server.create_database("lode") is True
        with psycopg.connect(server.url("lode")) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == ("lode",)

    assert server.pid is None
    assert _exited(pid)


def test_create_database_from_template_and_drop(server: EmbeddedPostgres) -> None:
    server.create_database("tmpl")
    with psycopg.connect(server.url("tmpl")) as conn:
        conn.execute("CREATE TABLE marker (x int)")

    assert server.create_database("copy", template="tmpl", strategy="file_copy") is True
    lingering = psycopg.connect(server.url("copy"))
    server.drop_database("copy")  # FORCE: open connections do not stop it
    server.drop_database("copy")  # already gone: fine
    lingering.close()

    assert server.create_database("copy", template="tmpl") is True
    with psycopg.connect(server.url("copy")) as conn:
        assert conn.execute("SELECT count(*) FROM marker").fetchone() == (0,)


def test_urls(server: EmbeddedPostgres) -> None:
    assert server.url("lode") == f"postgresql://postgres@127.0.0.1:{server.port}/lode"
    assert (
        server.sqlalchemy_url("lode")
        == f"postgresql+psycopg://postgres@127.0.0.1:{server.port}/lode"
    )


def test_start_failure_reports_the_log(server: EmbeddedPostgres, postgres_dir: Path) -> None:
    # A second cluster on the same data directory must be refused by Postgres itself.
    twin = EmbeddedPostgres(server.data_dir, free_port(), settings=FAST_SETTINGS)

    with pytest.raises(PostgresStartError, match=r"postmaster\.pid"):
        twin.start()

    assert twin.pid is None
    assert server.pid is not None


def test_start_requires_an_initialised_cluster(postgres_dir: Path) -> None:
    fresh = EmbeddedPostgres(postgres_dir / "data", free_port())

    with pytest.raises(PostgresStartError, match="ensure_initialized"):
        fresh.start()


def test_a_trusting_cluster_from_an_older_lode_up_is_upgraded_in_place(
    postgres_dir: Path,
) -> None:
    old = start_server(postgres_dir / "data", FAST_SETTINGS)  # no password: trust, as before
    with psycopg.connect(old.url()) as conn:
        conn.execute("CREATE TABLE notes (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO notes VALUES (1, 'kept')")
    old.stop()
    assert hba.trusts((postgres_dir / "data" / "pg_hba.conf").read_text())

    upgraded = EmbeddedPostgres(
        postgres_dir / "data", old.port, settings=FAST_SETTINGS, password="s3cret"
    )
    upgraded.start()
    try:
        assert _rows(upgraded) == [(1, "kept")]
        with pytest.raises(psycopg.OperationalError, match="no password supplied"):
            psycopg.connect(upgraded.url(password=""))
        assert not hba.trusts((postgres_dir / "data" / "pg_hba.conf").read_text())
        upgraded.stop()
        upgraded.start()  # already upgraded: starts as is
        assert _rows(upgraded) == [(1, "kept")]
    finally:
        upgraded.stop()


def test_a_new_cluster_with_a_password_trusts_nobody(postgres_dir: Path) -> None:
    server = start_server(postgres_dir / "data", FAST_SETTINGS, password="pw")
    try:
        assert server.url() == f"postgresql://postgres:pw@127.0.0.1:{server.port}/postgres"
        assert not hba.trusts((postgres_dir / "data" / "pg_hba.conf").read_text())
        with pytest.raises(psycopg.OperationalError, match="no password supplied"):
            psycopg.connect(server.url(password=""))
        with psycopg.connect(server.url()) as conn:
            stored = conn.execute(
                "SELECT rolpassword FROM pg_authid WHERE rolname = 'postgres'"
            ).fetchone()
        assert stored is not None
        assert str(stored[0]).startswith("SCRAM-SHA-256$")
        assert not list((postgres_dir / "data.run").glob("*.pw"))  # initdb's password file
    finally:
        server.stop()


def test_a_wrong_superuser_password_fails_fast(postgres_dir: Path) -> None:
    server = start_server(postgres_dir / "data", FAST_SETTINGS, password="right")
    server.stop()
    wrong = EmbeddedPostgres(postgres_dir / "data", server.port, settings=FAST_SETTINGS,
                             password="wrong", start_timeout_s=600)  # fmt: skip

    with pytest.raises(AuthenticationError, match="refuses the superuser password"):
        wrong.start()  # not after start_timeout_s: a password does not start working later

    assert wrong.pid is None


def test_restart_after_an_outside_sigkill(postgres_dir: Path) -> None:
    # Durable settings: with synchronous_commit off a SIGKILL may lose the last commit.
    server = start_server(postgres_dir / "data")
    try:
        _sigkill_then_restart(server)
    finally:
        server.stop()


def _sigkill_then_restart(server: EmbeddedPostgres) -> None:
    with psycopg.connect(server.url()) as conn:
        conn.execute("CREATE TABLE notes (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO notes VALUES (1, 'committed')")
    pid = server.pid
    assert pid is not None
    assert not server.exited

    os.kill(pid, signal.SIGKILL)  # not server.kill(): a crash nobody asked for
    while server.pid is not None:
        time.sleep(0.01)
    assert server.exited
    for _ in range(100):  # its backends may still hold the shared memory for a moment
        try:
            server.restart()
            break
        except PostgresStartError:
            time.sleep(0.1)

    assert not server.exited
    assert server.pid not in (None, pid)
    assert _rows(server) == [(1, "committed")]
