"""Jobs that move on without the pilot: a kill, or whatever it missed while NATS was away.

A kill reaches the pilot live, on its site's kill subjects (the ``KILLS`` row of
:mod:`lodestream.schemas.topology`). A core subscription hears nothing while the client
reconnects, so after every reconnect the pilot asks the log for the newest event of each
job it runs: if someone appended after our chain (a kill, or the controller fencing the
lease), the task is stopped at once instead of running on to a result that would be
refused.

Not every miss comes with a reconnect: a kill appended before the subscription reached the
server, or one dropped while the client was slow, leaves no trace. So the pilot also makes
the same check once per heartbeat TTL, whatever happens. Why a check and not a durable
consumer of kills: every pilot of a site must hear every kill of the site, and a shared
durable hands each message to *one* fetcher; a consumer per pilot would have to be created
by the site (which may create none) or by the control plane for every session. The check
costs one direct get per running job per TTL, by subject, on the site's own subjects
(the one read a site key has; a batched get names its subjects in the request body, which
the server cannot confine to the site's own), and it also catches a lease the controller
expired while we were not listening. A kill is thus acted on within one TTL at worst:
the time the server takes to notice a dead pilot, too.
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
from lodestream.agents.site.retry import stopped_within

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
            check = asyncio.create_task(self._check_all("while NATS was unreachable"))
            self._checks.add(check)
            check.add_done_callback(self._checks.discard)

    async def check_forever(self, interval_s: float, stop: asyncio.Event) -> None:
        """Every ``interval_s``, check the running jobs for what the live feed missed."""
        while not await stopped_within(stop, interval_s):
            if self._chains:
                await self._check_all("(found by the periodic check)")

    async def settled(self) -> None:
        """Wait for the checks still running (when the pilot exits)."""
        await asyncio.gather(*self._checks, return_exceptions=True)

    async def _check_all(self, when: str) -> None:
        for key, seq in list(self._chains.items()):
            try:
                moved = await self._moved_on(key, seq)
            except (nats.errors.Error, TimeoutError) as exc:
                # NATS is away: checking the other jobs would fail alike; the reconnect
                # (or the next period) checks them all again.
                log.warning("launcher: cannot check running jobs now: %s",
                            exc or type(exc).__name__)  # fmt: skip
                return
            if moved is None or self._chains.get(key) != seq:
                continue  # unchanged, unknown, or we reported it meanwhile
            if self._stop_task(key, f"{moved} {when}"):
                if moved == "job.killed":
                    self._report.killed += 1
                else:
                    self._report.fenced += 1

    async def _moved_on(self, key: JobKey, seq: int) -> str | None:
        """The type of the job's newest event if someone appended after ``seq``."""
        try:
            newest = await newest_event(self._js, key[0], "job", key[1])
        except NotWork as exc:
            log.warning("launcher: cannot check job %s: %s", key[1], exc)
            return None
        return newest.event.type if newest is not None and newest.seq > seq else None
