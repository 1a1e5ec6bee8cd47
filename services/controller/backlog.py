"""The controller's backlog feed: every period, a ``scaler.backlog`` for each elastic site
whose backlog changed.

Which sites: those whose elastic queue has appended a ``scaler.decided`` (the read model's
``rm.scalers``); a queue's first decision, made before any backlog reached it, is what
announces it. A site without an elastic queue costs nothing.

Each period costs four small queries, whatever the number of jobs — the projector's position,
the elastic sites, one aggregate over their runnable jobs (index ``jobs_site_state``), and
their open batch jobs — and, per elastic site, one direct get of the newest event on its
batch subjects. The position is read first: everything the projector had applied by then is
in the rows, so a site that waits for a backlog ``as_of_seq`` at or past its own batch
events knows the backlog has seen them, and one is sent as soon as that is possible.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from pydantic import ValidationError

from lodestream.eventlog import EventLog, Rejected
from lodestream.eventlog.transient import transient
from lodestream.schemas.errors import first_line
from lodestream.schemas.events.scaler import ScalerBacklog, ScalerBacklogData
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.services.controller.reads import ReadModel
from lodestream.services.controller.scaler import backlog_event, due, snapshot, stored_backlog

log = logging.getLogger(__name__)

NewestBatchSeq = Callable[[str], Awaitable[int]]


def newest_batch_seq(js: JetStreamContext) -> NewestBatchSeq:
    """The stream sequence of a site's newest batch event, whoever wrote it (0: none)."""

    async def newest(site: str) -> int:
        try:
            stored = await js.get_msg(EVENTS_STREAM, subject=f"evt.{site}.batch.>", direct=True)
        except NotFoundError:
            return 0
        return int(stored.seq or 0)

    return newest


class BacklogFeed:
    def __init__(
        self,
        reads: ReadModel,
        event_log: EventLog,
        newest_batch: NewestBatchSeq,
        *,
        period_s: float,
    ) -> None:
        self._reads = reads
        self._log = event_log
        self._newest_batch = newest_batch
        self._period_s = period_s
        self._published: dict[str, ScalerBacklogData] = {}
        self.appended = 0
        self.failures = 0  # periods that met Postgres or NATS away; tried again next period

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.run_once()
            except Exception as exc:  # never the end of the controller
                self.failures += 1
                if transient(exc):
                    log.warning("controller backlog feed: %s; trying again next period",
                                first_line(exc))  # fmt: skip
                    await self._reads.close()
                else:
                    log.exception("controller backlog feed failed; trying again next period")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._period_s)

    async def close(self) -> None:
        await self._reads.close()

    async def run_once(self) -> int:
        """Append the backlogs that changed; return how many."""
        as_of = await self._reads.position()
        scalers = await self._reads.scalers()
        if not scalers:
            return 0
        sites = sorted(scalers)
        backlogs = await self._reads.backlogs(sites)
        batch = await self._reads.open_batch_jobs(sites)
        events = []
        for site in sites:
            try:
                data = snapshot(site, as_of, backlogs.get(site), batch.get(site, []))
            except ValidationError as exc:  # one site's odd rows must not stop the others'
                log.warning("controller backlog feed: no backlog for %s: %s", site, exc)
                continue
            previous = self._published.get(site) or stored_backlog(scalers[site])
            if due(data, previous, await self._newest_batch(site)):
                events.append(backlog_event(site, data))
        if not events:
            return 0
        results = await self._log.append_many([(event, None) for event in events])
        done = 0
        for result in results:
            if isinstance(result, Rejected):
                log.warning("controller backlog feed: %s", result.error)
            elif isinstance(result.event, ScalerBacklog):
                self._published[result.event.site] = result.event.data
                done += 1
        self.appended += done
        return done
