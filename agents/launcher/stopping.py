"""Stopping the pilot's tasks: one that was killed, all of them when the pilot drains, and
all of them, unreported, when its session or its site's credential is gone.

A drain takes each task's chain before it signals the task, so that a task that dies of our
SIGTERM is reported as drained (timed out, naming what ended the pilot), not as an error.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from lodestream.agents.launcher import decide
from lodestream.agents.launcher.config import PilotConfig
from lodestream.agents.launcher.report import ExitReason
from lodestream.agents.launcher.running import Running
from lodestream.agents.launcher.session import LauncherSession
from lodestream.agents.launcher.state import PilotState
from lodestream.agents.launcher.tasks import Tracked
from lodestream.agents.launcher.work import JobKey, WorkItem

log = logging.getLogger(__name__)


class Stopping:
    def __init__(
        self,
        pilot: PilotConfig,
        session: LauncherSession,
        state: PilotState,
        running: Running,
    ) -> None:
        self._pilot = pilot
        self._session = session
        self._state = state
        self._running = running

    async def note_stop(self, stop: asyncio.Event, done: asyncio.Event) -> None:
        """Note when the pilot is told to stop (its SIGTERM), for a task that dies about then
        (:meth:`Running._ended_by_stop`)."""
        told = asyncio.create_task(stop.wait())
        over = asyncio.create_task(done.wait())
        try:
            await asyncio.wait((told, over), return_when=asyncio.FIRST_COMPLETED)
        finally:
            told.cancel()
            over.cancel()
        if stop.is_set():
            self._state.stopped_at = time.monotonic()
            self._state.stopping.set()

    def stop_task(self, key: JobKey, reason: str) -> bool:
        """Terminate the task of ``key`` and forget its chain; False if it does not run here."""
        for tracked in self._state.reaper.running():
            if tracked.task.job_id == str(key[1]):
                self._state.chains.pop(key, None)
                log.warning("launcher: stopping job %s: %s", key[1], reason)
                tracked.task.terminate(grace_s=2.0)
                return True
        return False

    async def drain(self, reason: ExitReason) -> None:
        """Kill what still runs and record it as RUN_TIMEOUT, chained on our lease."""
        state = self._state
        state.draining = True
        # A drain has a TTL to report: after that the lease expires and the controller does it.
        state.drain_until = time.monotonic() + self._session.ttl_s
        # Take the chains first, so a task that dies of our SIGTERM is not reported as an error.
        draining = [
            (tracked, item, state.chains.pop(key))
            for tracked in state.reaper.running()
            if (key := self._key_of(tracked)) in state.chains
            and (item := state.held.get(key)) is not None
        ]
        for tracked, _, _ in draining:
            tracked.task.terminate(grace_s=2.0)
        await asyncio.gather(
            *(self._report_drained(t, item, expect, reason) for t, item, expect in draining)
        )

    async def _report_drained(
        self, tracked: Tracked, item: WorkItem, expect: int, reason: ExitReason
    ) -> None:
        outcome = decide.drained(
            item, self._session.id, reason, tracked.task.returncode, batch=self._pilot.batch,
            remaining_s=self._session.remaining_min() * 60,
        )  # fmt: skip
        self._state.chains[item.key] = expect
        await self._running.report(item, outcome)

    def kill_all(self, reason: str) -> None:
        """Our session expired: the controller has fenced these jobs; stop them, report nothing."""
        for tracked in self._state.reaper.running():
            log.warning("launcher: killing job %s: %s", tracked.task.job_id, reason)
            self._state.chains.pop(self._key_of(tracked), None)
            tracked.task.kill()
            self._state.report.fenced += 1

    def _key_of(self, tracked: Tracked) -> JobKey:
        return (self._pilot.site, uuid.UUID(tracked.task.job_id))
