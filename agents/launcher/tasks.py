"""Running tasks and their reaper: one loop resolves every task's completion future.

A task that offers an exit descriptor (a pidfd on Linux) wakes the event loop the moment it
ends; there is no thread or waiter per task, so thousands of short tasks a second cost one
``add_reader`` each. Tasks without one (the fake backend) are polled every few milliseconds,
and every task is also polled slowly, which is where a pending ``terminate`` escalates to
SIGKILL once its grace period is over.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field

from lodestream.platform_adapters.launchers.base import RunningTask

POLL_S = 0.002  # tasks the loop cannot wait for
SWEEP_S = 0.05  # all tasks: escalation of terminate(), and a safety net


@dataclass(slots=True)
class Tracked:
    """A task the reaper watches. ``started`` is monotonic (its runtime); the ``*_at`` are
    wall-clock ``time.time()`` captures for the run's profile (:class:`RunProfile`)."""

    task: RunningTask
    started: float
    spawning_at: float = 0.0  # the pilot began spawning it
    started_at: float = 0.0  # the launcher's start (Popen) returned
    exited_at: float | None = None  # the reaper saw it end
    done: asyncio.Future[int] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Reaper:
    def __init__(self) -> None:
        self._tasks: dict[str, Tracked] = {}
        self._fds: dict[str, int] = {}
        self._wake = asyncio.Event()

    def __len__(self) -> int:
        return len(self._tasks)

    def track(
        self,
        task: RunningTask,
        *,
        spawning_at: float | None = None,
        started_at: float | None = None,
    ) -> Tracked:
        """Watch ``task``; the wall-clock times of its spawn default to now."""
        now = time.time()
        tracked = Tracked(task, time.monotonic(),
                          spawning_at=now if spawning_at is None else spawning_at,
                          started_at=now if started_at is None else started_at)  # fmt: skip
        self._tasks[task.job_id] = tracked
        fd = task.exit_fd()
        if fd is not None:
            self._fds[task.job_id] = fd
            asyncio.get_running_loop().add_reader(fd, self._exited, task.job_id)
        self._wake.set()
        return tracked

    def running(self) -> list[Tracked]:
        return list(self._tasks.values())

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set() or self._tasks:
                if not self._tasks:
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), 0.2)
                    continue
                for job_id, tracked in list(self._tasks.items()):
                    self._check(job_id, tracked)
                await asyncio.sleep(POLL_S if len(self._fds) < len(self._tasks) else SWEEP_S)
        finally:
            for job_id in list(self._fds):
                self._forget_fd(job_id)

    def _exited(self, job_id: str) -> None:
        # Readable once, for good: stop watching, whatever poll says (the sweep takes over).
        self._forget_fd(job_id)
        tracked = self._tasks.get(job_id)
        if tracked is not None:
            self._check(job_id, tracked)

    def _check(self, job_id: str, tracked: Tracked) -> None:
        code = tracked.task.poll()
        if code is None:
            return
        tracked.exited_at = time.time()
        del self._tasks[job_id]
        self._forget_fd(job_id)
        if not tracked.done.done():
            tracked.done.set_result(code)

    def _forget_fd(self, job_id: str) -> None:
        fd = self._fds.pop(job_id, None)
        if fd is not None:
            asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)
