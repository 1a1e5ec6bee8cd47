"""Jobs that move on without the pilot: a kill, or whatever it missed while NATS was away.

A kill reaches the pilot live, on ``evt.<site>.job.*.killed``. A core subscription
hears nothing while the client reconnects, so after every reconnect the pilot asks
the log for the newest event of each job it runs: if someone appended after our
chain (a kill, or the controller fencing the lease), the task is stopped at once
instead of running on to a result that would be refused.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import nats.errors
from nats.js import JetStreamContext

from lodestream.agents.launcher.reads import newest_event
from lodestream.agents.launcher.report import LauncherReport
from lodestream.agents.launcher.work import JobKey, NotWork, trusted_event

log = logging.getLogger(__name__)


class JobWatch:
    def __init__(
        self,
        js: JetStreamContext,
        site: str,
        *,
        chains: Mapping[JobKey, int],
        stop_task: Callable[[JobKey, str], bool],
        report: LauncherReport,
    ) -> None:
        self._js = js
        self._site = site
        self._chains = chains  # the launcher's: job -> last sequence of our CAS chain
        self._stop_task = stop_task
        self._report = report
        self._checks: set[asyncio.Task[None]] = set()

    async def on_killed(self, msg: Any) -> None:
        """A user killed one of our jobs: stop its task; the kill is its final word."""
        try:
            event = trusted_event(msg.subject, msg.data, self._site)
        except NotWork as exc:
            self._report.skipped += 1
            log.warning("launcher: refused kill on %s: %s", msg.subject, exc)
            return
        key = (event.site, event.aggregate_id)
        if event.type == "job.killed" and self._stop_task(key, "killed by its owner"):
            self._report.killed += 1

    def reconnected(self) -> None:
        if self._chains:
            check = asyncio.create_task(self._check_all())
            self._checks.add(check)
            check.add_done_callback(self._checks.discard)

    async def settled(self) -> None:
        """Wait for the checks still running (when the pilot exits)."""
        await asyncio.gather(*self._checks, return_exceptions=True)

    async def _check_all(self) -> None:
        for key, seq in list(self._chains.items()):
            moved = await self._moved_on(key, seq)
            if moved is None or self._chains.get(key) != seq:
                continue  # unchanged, unknown, or we reported it meanwhile
            if self._stop_task(key, f"{moved} while NATS was unreachable"):
                if moved == "job.killed":
                    self._report.killed += 1
                else:
                    self._report.fenced += 1

    async def _moved_on(self, key: JobKey, seq: int) -> str | None:
        """The type of the job's newest event if someone appended after ``seq``."""
        try:
            newest = await newest_event(self._js, key[0], "job", key[1])
        except (NotWork, nats.errors.Error, TimeoutError) as exc:
            log.warning("launcher: cannot check job %s: %s", key[1], exc or type(exc).__name__)
            return None
        return newest.event.type if newest is not None and newest.seq > seq else None
