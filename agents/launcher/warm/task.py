"""A job running in a warm worker, as the pilot's loop sees any task (``RunningTask``).

The task ends when its worker answers (the exit status pyrun would have had), or when the
worker dies: then its status is the worker's (``-signum`` if signalled), and the cause (the
signal, the time limit, the worker's peak RSS) is added to the job's stderr tail, which is
all the job's error event can say of a process that left no result. Signals go to the
worker's process group (the worker leads its own), so what the job started dies with it; a
worker that was signalled is never reused.
"""

from __future__ import annotations

import os
import select
import signal
import time
from typing import TYPE_CHECKING, Any

from lodestream.platform_adapters.errors import WaitTimedOut
from lodestream.platform_adapters.launchers.base import (
    DEFAULT_GRACE_S,
    DEFAULT_TAIL_BYTES,
    RunningTask,
    TaskSpec,
    read_tail,
)

if TYPE_CHECKING:
    from lodestream.agents.launcher.warm.pool import WarmPool, Worker

_NO_STATUS = -signal.SIGKILL  # the template never said: taken for killed


class WarmTask(RunningTask):
    def __init__(
        self, spec: TaskSpec, worker: Worker, pool: WarmPool, *, time_limit_s: float | None
    ) -> None:
        super().__init__(spec)
        self._worker = worker
        self._pool = pool
        self._code: int | None = None
        self._deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
        self._time_limit_s = time_limit_s
        self._kill_at: float | None = None
        self._killed = False
        self.cause = ""  # why the worker died, for the job's stderr tail

    @property
    def pid(self) -> int:
        return self._worker.pid

    @property
    def returncode(self) -> int | None:
        return self._code

    def exit_fd(self) -> int | None:
        if self._code is not None or self._worker.gone:
            return None
        return os.dup(self._worker.sock.fileno())

    def poll(self) -> int | None:
        if self._code is not None:
            return self._code
        now = time.monotonic()
        if self._deadline is not None and now >= self._deadline and not self._killed:
            self.cause = f"the job ran past its time limit of {self._time_limit_s:g} s"
            self.kill()
        elif self._kill_at is not None and not self._killed and now >= self._kill_at:
            self.kill()
        worker = self._worker
        for answer in worker.reader.frames():
            if "code" in answer:
                return self._finish(int(answer["code"]), answer)
        if worker.reader.closed:
            status = self._pool.worker_died(worker)
            code, maxrss_kb = status if status is not None else (_NO_STATUS, 0)
            self._explain(code, maxrss_kb, status is None)
            self._code = code
        return self._code

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            left = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
            if left <= 0:
                raise WaitTimedOut(f"job {self.job_id} still running after {timeout}s")
            if not self._worker.gone:
                select.select([self._worker.sock], [], [], left)
        return code

    def terminate(self, grace_s: float = DEFAULT_GRACE_S) -> None:
        if self._code is not None or self._killed:
            return
        kill_at = time.monotonic() + max(grace_s, 0.0)
        self._kill_at = kill_at if self._kill_at is None else min(self._kill_at, kill_at)
        self._worker.signal(signal.SIGTERM)

    def kill(self) -> None:
        if self._code is not None or self._killed:
            return
        self._killed = True
        self._worker.signal(signal.SIGKILL)

    def stderr_tail(self, max_bytes: int = DEFAULT_TAIL_BYTES) -> str:
        tail = read_tail(self.spec.stderr_path, max_bytes)
        if not self.cause:
            return tail
        return f"{tail}{'' if not tail or tail.endswith(chr(10)) else chr(10)}{self.cause}\n"

    def _finish(self, code: int, answer: dict[str, Any]) -> int:
        if self._killed or self._kill_at is not None:  # signalled after it answered: let it go
            answer = {**answer, "recycle": True}
        self._pool.job_ended(self._worker, answer)
        self._code = code
        return code

    def _explain(self, code: int, maxrss_kb: int, unknown: bool) -> None:
        if unknown:
            how = "died; its exit status is unknown"
        elif code < 0:
            how = f"was killed by {_signal_name(-code)}"
        else:
            how = f"exited with status {code} (os._exit or sys.exit in a thread?)"
        peak = f"; its peak RSS was {maxrss_kb / 1024:.0f} MiB" if maxrss_kb else ""
        why = f" ({self.cause})" if self.cause else ""
        self.cause = f"lodestream: the Python worker (pid {self.pid}) running the job {how}"
        self.cause += f"{why}{peak}"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
