"""One component's ``run(stop)`` loop as a task for the length of a ``with`` block."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any


@asynccontextmanager
async def running_until_stopped(
    run: Callable[[asyncio.Event], Coroutine[Any, Any, object]],
    *,
    stop_timeout_s: float | None = None,
) -> AsyncIterator[None]:
    """``run(stop)`` runs while the block does; then ``stop`` is set and the task awaited
    (for at most ``stop_timeout_s``, if given), so what it raised fails the test."""
    stop = asyncio.Event()
    task = asyncio.create_task(run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, stop_timeout_s)
