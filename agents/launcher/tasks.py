"""Running tasks and their reaper: one poll loop resolves every task's completion future.

Polling all children every few milliseconds from one loop is cheaper than a
thread or a waiter per task when thousands of short tasks run per second.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from platform_adapters.launchers.base import RunningTask

POLL_S = 0.002


@dataclass(slots=True)
class Tracked:
    task: RunningTask
    started: float
    done: asyncio.Future[int] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Reaper:
    def __init__(self) -> None:
        self._tasks: dict[str, Tracked] = {}
        self._wake = asyncio.Event()

    def __len__(self) -> int:
        return len(self._tasks)

    def track(self, task: RunningTask) -> Tracked:
        tracked = Tracked(task, time.monotonic())
        self._tasks[task.job_id] = tracked
        self._wake.set()
        return tracked

    def running(self) -> list[Tracked]:
        return list(self._tasks.values())

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set() or self._tasks:
            if not self._tasks:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), 0.2)
                continue
            for job_id, tracked in list(self._tasks.items()):
                code = tracked.task.poll()
                if code is not None:
                    del self._tasks[job_id]
                    if not tracked.done.done():
                        tracked.done.set_result(code)
            await asyncio.sleep(POLL_S)
