"""The elastic queue's loop against an in-memory log: what it appends, when it waits, how it
completes a decision cut short, and that faults are counted, never raised."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats.errors
import pytest
from pydantic import ValidationError

from lodestream.agents.site.elastic import ElasticQueue, record
from lodestream.agents.site.elastic.policy import plan
from lodestream.agents.site.elastic.scalerlog import ScalerLog, Stored
from lodestream.agents.site.settings import BACKFILL_SCHEDULERS, ElasticSettings, SiteSettings
from lodestream.eventlog import Appended, ConflictError
from lodestream.platform_adapters.schedulers import (
    BackfillWindow,
    CobaltScheduler,
    FakeScheduler,
    FluxScheduler,
    LocalScheduler,
    LsfScheduler,
    PbsScheduler,
    Scheduler,
    SlurmScheduler,
    scheduler_names,
)
from lodestream.schemas.envelope import Event
from lodestream.schemas.events import BatchJobDeletionRequested, BatchJobRequested
from lodestream.schemas.events.scaler import (
    ScalerBacklog,
    ScalerBacklogData,
    ScalerBatchJob,
    ScalerDecided,
    scaler_id,
)

SITE = "alpha"
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SETTINGS = ElasticSettings(enabled=True, queue="debug", max_nodes=2, max_queued_jobs=2)


class MemoryLog(ScalerLog):
    """The subjects a site may read and write, in memory, with compare-and-set on the scaler."""

    def __init__(self) -> None:  # no JetStream behind it
        self.events: list[tuple[int, Event]] = []
        self.refused = 0
        self.fail: Exception | None = None  # raised by the next call, once
        self.before_append: Callable[[], None] | None = None

    def store(self, event: Event) -> int:
        seq = len(self.events) + 1
        self.events.append((seq, event))
        return seq

    def of_type(self, event_type: str) -> list[Event]:
        return [e for _, e in self.events if e.type == event_type]

    def _find(self, subject: str) -> tuple[int, Event] | None:
        found = [(s, e) for s, e in self.events if e.subject == subject]
        return found[-1] if found else None

    def _check(self) -> None:
        if self.fail is not None:
            fail, self.fail = self.fail, None
            raise fail

    async def backlog(self) -> Stored[ScalerBacklog] | None:
        self._check()
        newest = self._find(f"evt.{SITE}.scaler.{scaler_id(SITE)}.backlog")
        return Stored(newest[0], newest[1]) if newest else None  # type: ignore[arg-type]

    async def decision(self) -> Stored[ScalerDecided] | None:
        self._check()
        newest = self._find(f"evt.{SITE}.scaler.{scaler_id(SITE)}.decided")
        return Stored(newest[0], newest[1]) if newest else None  # type: ignore[arg-type]

    async def append(self, event: Event, *, expect: int | None) -> Appended:
        self._check()
        if self.before_append is not None:
            self.before_append()
        if expect is not None:
            prefix = event.aggregate_subjects[:-1]
            last = max((s for s, e in self.events if e.subject.startswith(prefix)), default=0)
            if last != expect:
                raise ConflictError(event.subject, expect, last, "wrong last sequence")
        return Appended(event, self.store(event), duplicate=False)

    async def ensure(self, event: Event, *, expect: int | None) -> int:
        self._check()
        newest = self._find(event.subject)
        if newest is not None and newest[1].id == event.id:
            return newest[0]
        return (await self.append(event, expect=expect)).seq


def backlog(log: MemoryLog, footprint: float, *jobs: ScalerBatchJob, as_of: int = 0) -> int:
    data = ScalerBacklogData(
        as_of_seq=as_of or len(log.events), runnable_jobs=int(footprint + 0.999),
        node_footprint=footprint, batch_jobs=jobs,
    )  # fmt: skip
    event = ScalerBacklog.create(
        site=SITE, aggregate_id=scaler_id(SITE), actor="controller:main", data=data
    )
    return log.store(event)


def queue(log: MemoryLog, settings: ElasticSettings = SETTINGS, **kwargs: Any) -> ElasticQueue:
    return ElasticQueue(log, SITE, settings, clock=kwargs.pop("clock", lambda: NOW), **kwargs)


def requested_as_open(log: MemoryLog) -> tuple[ScalerBatchJob, ...]:
    """What the control plane would list once the projector has folded the requests."""
    return tuple(
        ScalerBatchJob(
            id=e.aggregate_id,
            state="requested",
            num_nodes=e.data.num_nodes,
            wall_time_min=e.data.wall_time_min,
            requested_at=e.occurred_at,
            elastic=True,
        )
        for e in log.of_type("batch.requested")
        if isinstance(e, BatchJobRequested)
    )


async def test_the_first_decision_is_made_without_a_backlog_and_not_repeated() -> None:
    log = MemoryLog()
    elastic = queue(log)
    assert await elastic.run_cycle() == "decided"
    [decided] = log.of_type("scaler.decided")
    assert isinstance(decided, ScalerDecided)
    assert decided.actor == "site:alpha"
    assert decided.data.reason == "no backlog from the control plane yet"
    assert decided.data.limits == SETTINGS.limits
    assert await elastic.run_cycle() == "unchanged"
    assert len(log.of_type("scaler.decided")) == 1


async def test_a_backlog_is_answered_with_requests_then_a_wait_for_a_backlog_that_saw_them() -> (
    None
):
    log = MemoryLog()
    elastic = queue(log)
    backlog(log, 5)
    assert await elastic.run_cycle() == "decided"
    decided = log.of_type("scaler.decided")[-1]
    assert isinstance(decided, ScalerDecided)
    requested = log.of_type("batch.requested")
    assert [e.aggregate_id for e in requested] == [r.batch_job_id for r in decided.data.requests]
    assert all(e.causation_id == decided.id for e in requested)
    assert decided.data.backlog is not None
    assert decided.data.backlog_id == log.of_type("scaler.backlog")[-1].id

    # The same old backlog again: it has not seen the requests, so deciding would double them.
    assert await elastic.run_cycle() == "waiting"
    # The control plane's next backlog lists them: covered up to max_queued_jobs.
    backlog(log, 5, *requested_as_open(log))
    assert await elastic.run_cycle() == "decided"
    decided = log.of_type("scaler.decided")[-1]
    assert isinstance(decided, ScalerDecided)
    assert decided.data.reason.endswith("max_queued_jobs is 2")
    assert len(log.of_type("batch.requested")) == 2
    assert await elastic.run_cycle() == "unchanged"


async def test_a_decision_cut_short_is_completed_by_the_next_agent_not_doubled() -> None:
    log = MemoryLog()
    backlog(log, 3)
    data = log.of_type("scaler.backlog")[-1]
    assert isinstance(data, ScalerBacklog)
    result = plan(data.data, None, SETTINGS.limits, NOW)
    decision = record.decided(SITE, result, backlog=data, windows=None, limits=SETTINGS.limits,
                              now=NOW)  # fmt: skip
    log.store(decision)
    first, _ = record.effects(decision)[0]
    log.store(first)  # the agent stopped after one of its two requests

    restarted = queue(log)
    assert await restarted.run_cycle() == "waiting"  # completed, then waits for a backlog
    assert [e.id for e in log.of_type("batch.requested")] == [
        e.id for e, _ in record.effects(decision)
    ]
    assert await queue(log).run_cycle() == "waiting"  # yet another agent: nothing doubled
    assert len(log.of_type("batch.requested")) == 2


async def test_faults_are_counted_and_the_next_period_goes_on() -> None:
    log = MemoryLog()
    elastic = queue(log)
    backlog(log, 2)
    log.fail = nats.errors.ConnectionClosedError()
    assert await elastic.run_cycle() == "fault"
    log.fail = TimeoutError("no answer")
    assert await elastic.run_cycle() == "fault"
    log.fail = RuntimeError("a bug")  # even this is logged and counted, not raised
    assert await elastic.run_cycle() == "fault"
    assert elastic.faults == 3
    assert await elastic.run_cycle() == "decided"
    assert len(log.of_type("batch.requested")) == 1


async def test_effects_that_failed_to_append_are_appended_next_period() -> None:
    log = MemoryLog()
    elastic = queue(log)
    backlog(log, 4)
    calls = 0

    def fail_after_the_decision() -> None:
        nonlocal calls
        calls += 1
        if calls == 2:  # the decision lands, its first request does not
            raise nats.errors.TimeoutError

    log.before_append = fail_after_the_decision
    assert await elastic.run_cycle() == "fault"
    assert len(log.of_type("scaler.decided")) == 1
    assert log.of_type("batch.requested") == []
    log.before_append = None
    assert await elastic.run_cycle() == "waiting"
    assert len(log.of_type("batch.requested")) == 2
    assert len(log.of_type("scaler.decided")) == 1


async def test_a_backlog_that_arrives_while_deciding_makes_it_decide_again() -> None:
    log = MemoryLog()
    elastic = queue(log)
    backlog(log, 2)
    log.before_append = lambda: (backlog(log, 3), None)[1]
    assert await elastic.run_cycle() == "conflict"
    log.before_append = None
    assert log.of_type("scaler.decided") == []
    assert await elastic.run_cycle() == "decided"
    decided = log.of_type("scaler.decided")[-1]
    assert isinstance(decided, ScalerDecided)
    assert decided.data.backlog is not None
    assert decided.data.backlog.node_footprint == 3


async def test_stale_batch_jobs_are_deleted_once_even_across_restarts() -> None:
    log = MemoryLog()
    settings = SETTINGS.model_copy(update={"max_queue_wait_min": 10})
    stale = ScalerBatchJob(id=uuid.uuid4(), state="queued", num_nodes=2, wall_time_min=30,
                           requested_at=NOW - timedelta(minutes=11), elastic=True)  # fmt: skip
    backlog(log, 2, stale)
    assert await queue(log, settings).run_cycle() == "decided"
    [deleted] = log.of_type("batch.deletion_requested")
    assert isinstance(deleted, BatchJobDeletionRequested)
    assert deleted.aggregate_id == stale.id
    assert "over max_queue_wait_min (10)" in deleted.data.reason
    assert len(log.of_type("batch.requested")) == 1  # its replacement
    assert await queue(log, settings).run_cycle() == "waiting"
    assert len(log.of_type("batch.deletion_requested")) == 1


async def test_backfill_windows_come_from_the_scheduler_and_its_failures_are_faults(
    tmp_path: Path,
) -> None:
    log = MemoryLog()
    scheduler = FakeScheduler()
    scheduler.windows = [BackfillWindow(queue="debug", nodes=3, minutes=40)]
    settings = SETTINGS.model_copy(update={"use_backfill": True, "max_nodes": 8})
    elastic = queue(log, settings, scheduler=scheduler)
    backlog(log, 6)
    scheduler.unavailable = True
    assert await elastic.run_cycle() == "fault"
    scheduler.unavailable = False
    assert await elastic.run_cycle() == "decided"
    decided = log.of_type("scaler.decided")[-1]
    assert isinstance(decided, ScalerDecided)
    [request] = decided.data.requests
    assert (request.request.num_nodes, request.request.wall_time_min) == (3, 30)  # 30 needed
    assert decided.data.windows is not None
    assert request.window == decided.data.windows[0]


def test_backfill_needs_a_scheduler_that_can_tell_it(tmp_path: Path) -> None:
    settings = SETTINGS.model_copy(update={"use_backfill": True})
    with pytest.raises(ValueError, match="no scheduler to tell backfill windows"):
        ElasticQueue(MemoryLog(), SITE, settings, None)
    site: dict[str, Any] = {
        "site": SITE, "nats": {"url": "wss://127.0.0.1:1"}, "directory": tmp_path,
        "elastic": settings.model_dump(),
    }  # fmt: skip
    for kind in ("local", "flux"):
        with pytest.raises(ValidationError, match=f"the {kind} scheduler cannot tell backfill"):
            SiteSettings.model_validate(site | {"scheduler": {"type": kind}})
    assert SiteSettings.model_validate(site | {"scheduler": {"type": "slurm"}})


def test_the_schedulers_said_to_tell_backfill_are_those_whose_adapters_can() -> None:
    can = {name for name in scheduler_names() if _backend(name).capabilities.backfill}
    assert can - {"fake"} == BACKFILL_SCHEDULERS


def _backend(name: str) -> type[Scheduler]:
    return {cls.name: cls for cls in (SlurmScheduler, PbsScheduler, LsfScheduler,
                                      CobaltScheduler, FluxScheduler, LocalScheduler,
                                      FakeScheduler)}[name]  # fmt: skip
