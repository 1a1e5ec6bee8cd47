"""A supervised child process: started with a log file, restarted if it dies, stopped by SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)


class ServiceProcess:
    def __init__(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = log_path
        self.restarts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        self._log = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            self.argv,
            env={**os.environ, **self.env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in the terminal reaches `lode up`, which stops us
        )

    def ensure_running(self) -> bool:
        """Restart the process if it exited; True if it had to be restarted."""
        if self._proc is None or self.running:
            return False
        log.warning("%s exited with %s; restarting", self.name, self._proc.returncode)
        self.restarts += 1
        self._close_log()
        self.start()
        return True

    def stop(self, timeout_s: float = 15.0) -> None:
        if self._proc is None:
            return
        if self.running:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %.0fs; killing it", self.name, timeout_s)
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        self._close_log()

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
