"""Keep trying what a site process cannot do without (NATS, its session), politely.

A pilot can start before NATS is reachable (a batch job scheduled during a
maintenance window, a control plane restarting). It neither crashes nor
hammers the server: it retries with capped exponential backoff, logs every
try, and gives up only when told to stop or when its own deadline (the
pilot's wall time) has passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Backoff:
    first_s: float = 0.5
    cap_s: float = 30.0

    def delay(self, tries: int) -> float:
        """The pause after ``tries`` failed tries (1 for the first failure)."""
        base = min(self.cap_s, self.first_s * 2.0 ** min(tries - 1, 32))
        # Jitter: a fleet of pilots that lost NATS together must not come back in lockstep.
        return base * random.uniform(0.75, 1.0)  # noqa: S311 - jitter, not a secret


async def stopped_within(stop: asyncio.Event | None, seconds: float) -> bool:
    """Sleep up to ``seconds``; True as soon as ``stop`` is set."""
    if stop is None:
        await asyncio.sleep(seconds)
        return False
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()


async def retry_until(
    what: str,
    attempt: Callable[[], Awaitable[T]],
    *,
    retryable: Callable[[Exception], bool],
    stop: asyncio.Event | None = None,
    deadline: float = math.inf,
    backoff: Backoff = Backoff(),
) -> T | None:
    """``await attempt()`` until it succeeds; None once ``stop`` is set or ``deadline`` (a
    ``time.monotonic()`` value) has passed. A failure ``retryable`` refuses is raised."""
    tries = 0
    while stop is None or not stop.is_set():
        tries += 1
        try:
            return await attempt()
        except Exception as exc:
            if not retryable(exc):
                raise
            failure = _reason(exc)
        left = deadline - time.monotonic()
        if left <= 0:
            log.error("%s: giving up after %d tries: %s", what, tries, failure)
            return None
        pause = min(backoff.delay(tries), left)
        log.warning("%s: try %d failed (%s); next in %.1f s", what, tries, failure, pause)
        await stopped_within(stop, pause)
    log.info("%s: stopped after %d tries", what, tries)
    return None


def _reason(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
