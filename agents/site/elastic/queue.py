"""The elastic queue's loop: every period, read the backlog, decide, record, request.

One cycle:

1. Read the newest ``scaler.backlog`` (the control plane's) and ``scaler.decided`` (ours).
2. Complete the last decision once per process: append whatever batch events it caused that
   are not on the log yet (an agent stopped half-way, or NATS went away mid-cycle).
3. Wait for a backlog that has seen those batch events (``as_of_seq`` at or past their
   sequences): deciding on an older one would request the same nodes again.
4. Ask the scheduler for backfill windows, if the limits say so.
5. Plan (:mod:`.policy`); a plan that does nothing on the same inputs as the last decision is
   not recorded again. Otherwise append the decision, compare-and-set on the newest scaler
   event read in 1 (a newer backlog makes it decide again next period, on that one), then
   the batch events it causes.

A fault — NATS away, the scheduler's command failing, an event the rule refuses — is logged,
counted in ``faults`` and tried again next period; nothing here stops the site agent.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Final, Literal

import nats.errors

from lodestream.agents.site.elastic import record
from lodestream.agents.site.elastic.policy import plan
from lodestream.agents.site.elastic.scalerlog import ScalerLog, Stored
from lodestream.agents.site.retry import stopped_within
from lodestream.agents.site.settings import ElasticSettings
from lodestream.eventlog import ConflictError, EventLogError
from lodestream.eventlog.kernel import Append, commit_one
from lodestream.platform_adapters.errors import SchedulerError
from lodestream.platform_adapters.schedulers.base import Scheduler
from lodestream.schemas.events.scaler import (
    ScalerBacklog,
    ScalerDecided,
    ScalerLimits,
    WindowData,
)

log = logging.getLogger(__name__)

Outcome = Literal["decided", "unchanged", "waiting", "conflict", "fault"]
FAULTS: Final = (
    nats.errors.Error, EventLogError, SchedulerError, TimeoutError, OSError,
)  # fmt: skip


class ElasticQueue:
    def __init__(
        self,
        scaler_log: ScalerLog,
        site: str,
        settings: ElasticSettings,
        scheduler: Scheduler | None = None,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if settings.use_backfill and (scheduler is None or not scheduler.capabilities.backfill):
            what = f"the {scheduler.name} scheduler" if scheduler else "no scheduler"
            raise ValueError(f"elastic.use_backfill: {what} to tell backfill windows")
        self._log = scaler_log
        self._site = site
        self._settings = settings
        self._limits = settings.limits
        self._scheduler = scheduler
        self._clock = clock
        # The last decision whose effects are all on the log, and their newest sequence.
        self._completed: uuid.UUID | None = None
        self._effects_seq = 0
        self.outcomes: dict[Outcome, int] = dict.fromkeys(
            ("decided", "unchanged", "waiting", "conflict", "fault"), 0
        )

    @property
    def faults(self) -> int:
        return self.outcomes["fault"]

    async def run(self, stop: asyncio.Event) -> None:
        log.info("elastic queue of %s: every %g s, %s", self._site, self._settings.period_s,
                 self._limits.model_dump(exclude_defaults=True))  # fmt: skip
        while not stop.is_set():
            await self.run_cycle()
            if await stopped_within(stop, self._settings.period_s):
                break
        log.info("elastic queue stops: %s", self.outcomes)

    async def run_cycle(self) -> Outcome:
        """One period's work; never raises for a fault, which is logged and counted."""
        try:
            outcome = await self._cycle()
        except FAULTS as exc:
            log.warning("elastic queue: %s: %s; trying again next period",
                        type(exc).__name__, exc)  # fmt: skip
            outcome = "fault"
        except Exception:
            log.exception("elastic queue: unexpected failure; trying again next period")
            outcome = "fault"
        self.outcomes[outcome] += 1
        return outcome

    async def _cycle(self) -> Outcome:
        backlog = await self._log.backlog()
        last = await self._log.decision()
        if last is not None and last.event is not None:
            await self._complete(last.event)
        current = backlog.event if backlog is not None else None
        if current is not None and current.data.as_of_seq < self._effects_seq:
            log.debug("elastic queue: backlog as of %d predates our batch events (%d); waiting",
                      current.data.as_of_seq, self._effects_seq)  # fmt: skip
            return "waiting"
        windows = await self._windows() if self._limits.use_backfill else None
        now = self._clock()
        result = plan(current.data if current else None, windows, self._limits, now)
        if not result.acts and _same_inputs(last, current, windows, self._limits, result.reason):
            return "unchanged"
        decision = record.decided(
            self._site, result, backlog=current, windows=windows, limits=self._limits, now=now
        )
        expect = max(backlog.seq if backlog else 0, last.seq if last else 0)
        if await commit_one(self._log, Append(decision, expect)) is None:
            # A backlog (or another agent's decision) came after what we read: decide again
            # on it next period.
            log.info("elastic queue: the scaler moved on while deciding; deciding again later")
            return "conflict"
        log.info("elastic queue: %s", result.reason)
        await self._complete(decision)
        return "decided"

    async def _complete(self, decision: ScalerDecided) -> None:
        if decision.id == self._completed:
            return
        for event, expect in record.effects(decision):
            try:
                seq = await self._log.ensure(event, expect=expect)
            except ConflictError as exc:  # that batch job id exists, and not by us: leave it
                log.warning("elastic queue: %s not appended: %s", event.type, exc)
                continue
            self._effects_seq = max(self._effects_seq, seq)
        self._completed = decision.id

    async def _windows(self) -> tuple[WindowData, ...]:
        assert self._scheduler is not None  # checked in __init__
        found = await asyncio.to_thread(self._scheduler.backfill_windows)
        return tuple(WindowData(queue=w.queue, nodes=w.nodes, minutes=w.minutes) for w in found)


def _same_inputs(
    last: Stored[ScalerDecided] | None,
    backlog: ScalerBacklog | None,
    windows: tuple[WindowData, ...] | None,
    limits: ScalerLimits,
    reason: str,
) -> bool:
    """The last decision did nothing either, from the same backlog, windows and limits."""
    if last is None or last.event is None:
        return False
    data = last.event.data
    return (
        not (data.requests or data.deletions)
        and data.backlog_id == (backlog.id if backlog is not None else None)
        and data.windows == windows
        and data.limits == limits
        and data.reason == reason
    )
