"""A service child process: started with a log file, restarted when it died, stopped by SIGTERM.

When and how often it is restarted is the supervisor's business
(:mod:`lodestream.services.embedded.supervisor`); this class only says whether it
exited and starts it again.
"""

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

    @property
    def exited(self) -> bool:
        """Started, then ended without :meth:`stop`: a crash the supervisor should repair."""
        return self._proc is not None and self._proc.poll() is not None

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode if self._proc is not None else None

    def restart(self) -> None:
        """Start again after the process exited; a running process is left alone."""
        if self.running:
            return
        self._close_log()
        self.start()

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
