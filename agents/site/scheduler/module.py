"""The site agent's scheduler module: submits pilot batch jobs and follows them to their end.

    sched-<site>: batch.requested           → render the template, submit  → batch.submitted
                                                                  refused   → batch.submit_failed
                  batch.deletion_requested  → cancel at the scheduler (or end it unsubmitted)
    every sync_interval_s: status() of the active batch jobs → batch.queued | running | finished

One loop does both, in turn, so nothing here runs concurrently: a delivery, then (when due) a
sync. Every delivery is checked with the shared rule first (:mod:`lodestream.schemas.trust`).

**A batch job is work in progress of ``sched-<site>`` from its request to its end.** The
``batch.requested`` delivery is acknowledged only once the batch job has ended: until then it
is held (and kept from redelivery with ``in_progress`` at every sync). An agent that stops
hands its held deliveries back (nak); one that dies has them redelivered after the consumer's
ack wait. Either way the next agent is handed every batch job it must follow, and reads each
one's state from the log — the set of active batch jobs is never kept anywhere but the server.

**Nothing is submitted twice.** Before submitting, the module reads the batch job from the
log: a ``batch.submitted`` there is adopted, not repeated. The scheduler's job name carries the
batch id, so a redelivered request whose first try died between ``submit`` and the append is
found at the scheduler and adopted too. Every append is compare-and-set on the batch job's last
event with an id derived from its cause, so two deciders cannot both land.

A scheduler command that is missing, hangs or fails during a sync is logged and counted
(``scheduler_errors``) and tried again at the next sync; it never stops the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from lodestream.agents.site.scheduler import decide
from lodestream.agents.site.scheduler.decide import DeletionStep, RequestStep
from lodestream.agents.site.scheduler.history import read_batch_job
from lodestream.agents.site.scheduler.pilot_end import pilot_end_path, read_pilot_end
from lodestream.agents.site.scheduler.template import (
    TemplateError,
    check_passes_filter,
    pilot_values,
    read_template,
    render,
)
from lodestream.agents.site.settings import SiteSettings
from lodestream.eventlog import EventLog
from lodestream.eventlog.kernel import (
    ACK,
    HOLD,
    Append,
    DeliveryCounts,
    Nak,
    commit_one,
    deliveries,
    hand_back,
    settle,
)
from lodestream.eventlog.pull import PullLoop, pull_consumer, stream_seq, work_and_tick
from lodestream.eventlog.transient import transient
from lodestream.platform_adapters.errors import (
    InvalidSubmission,
    NotSupported,
    SchedulerError,
    SchedulerUnavailable,
    SubmitRejected,
    UnknownBatchJob,
)
from lodestream.platform_adapters.schedulers.base import BatchRecord, BatchRequest, Scheduler
from lodestream.schemas.batch import BatchView, apply_batch, fold_batch
from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import Untrusted, first_line
from lodestream.schemas.events import BatchJobRequested
from lodestream.schemas.topology import SCHED
from lodestream.schemas.trust import check_own_site, event_from_message

log = logging.getLogger(__name__)

RETRY_S: Final = SCHED.retry_s  # before a delivery that met a busy scheduler or NATS is tried again
MAX_SUBMIT_TRIES: Final = 5  # a scheduler that never answers a submission: submit_failed
REBASES: Final = 3


@dataclass(slots=True)
class Tracked:
    """An active batch job: its view, and the ``batch.requested`` delivery held until it ends."""

    view: BatchView
    msg: Any
    misses: int = 0


@dataclass(slots=True)
class SchedulerStats:
    submitted: int = 0
    submit_failed: int = 0
    cancelled: int = 0
    synced: int = 0  # queued, running and finished events appended
    scheduler_errors: int = 0
    deliveries: DeliveryCounts = field(default_factory=DeliveryCounts)  # refused, retried, failed


class PilotScheduler:
    def __init__(
        self,
        js: Any,
        settings: SiteSettings,
        scheduler: Scheduler,
        *,
        durable: str | None = None,
        retry_s: float = RETRY_S,
    ) -> None:
        self._js = js
        self._log = EventLog(js)
        self._settings = settings
        self._cfg = settings.scheduler
        self._site = settings.site
        self._durable = durable or SCHED.durable(settings.site)
        self.scheduler = scheduler
        self._retry_s = retry_s
        self.tracked: dict[uuid.UUID, Tracked] = {}
        self.stats = SchedulerStats()
        # ``handle`` settles or holds each delivery itself; the kernel terms what the shared
        # rule refuses and hands back what met NATS away.
        self.consume = deliveries(self.handle, "scheduler", retry_s=retry_s,
                                  counts=self.stats.deliveries)  # fmt: skip
        self.appended = 0  # events this module put on the log

    # --- the loop ---------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        sub = await pull_consumer(self._js, SCHED.stream, self._durable)
        pulling = PullLoop(sub, name="scheduler", batch=16, timeout_s=0.5)
        try:
            await work_and_tick(pulling, self.consume, self.sync, self._cfg.sync_interval_s, stop)
        finally:
            await hand_back(sub, self._held(), "scheduler")
            self.tracked.clear()
            log.info("scheduler stops: %s", self.stats)

    async def handle(self, msg: Any) -> None:
        """Act on one delivery of ``sched-<site>``; :class:`Untrusted` if it is no work here."""
        event = check_own_site(event_from_message(msg.subject, msg.data), self._site)
        if not SCHED.carries(event.type):
            raise Untrusted(f"{event.type} hands no work to the scheduler module")
        if isinstance(event, BatchJobRequested):
            await self._on_requested(event, msg)
        else:
            await self._on_deletion(event, msg)

    def _held(self) -> list[Any]:
        """The deliveries of the requests this agent follows: given back when it stops."""
        return [tracked.msg for tracked in self.tracked.values() if tracked.msg is not None]

    # --- requests ---------------------------------------------------------------------------

    async def _on_requested(self, event: Event, msg: Any) -> None:
        held = self.tracked.get(event.aggregate_id)
        if held is not None:  # redelivered while we follow it: hold the newest delivery
            held.msg = msg
            return
        view = await self._view(event.aggregate_id) or fold_batch([(stream_seq(msg), event)])
        assert view is not None
        match decide.on_request(view):
            case RequestStep.DONE:
                await settle(msg, ACK, "scheduler")
            case RequestStep.TRACK:
                self.tracked[view.id] = Tracked(view, msg)
            case RequestStep.END_UNSUBMITTED:
                await self._append(decide.ended_unsubmitted(view), view)
                await settle(msg, ACK, "scheduler")
            case RequestStep.SUBMIT:
                await self._submit(view, msg)

    async def _submit(self, view: BatchView, msg: Any) -> None:
        tries = int(msg.metadata.num_delivered)
        try:
            # Delivered before: an earlier try may have submitted and died before recording it.
            found = await self._find_at_scheduler(view.id) if tries > 1 else None
        except SchedulerError as exc:
            self._scheduler_error(f"looking for batch job {view.id}", exc)
            await settle(msg, Nak(self._retry_s), "scheduler")
            return
        if found is not None:
            log.info("scheduler: batch job %s was submitted as %s before; adopted", view.id, found)
            outcome: str | _Refused | _Retry = found
        else:
            outcome = await self._submit_to_scheduler(view)
        if isinstance(outcome, _Retry):
            if tries < MAX_SUBMIT_TRIES:
                log.warning("scheduler: batch job %s not submitted (%s); try %d of %d in %g s",
                            view.id, outcome.reason, tries, MAX_SUBMIT_TRIES,
                            self._retry_s)  # fmt: skip
                await settle(msg, Nak(self._retry_s), "scheduler")
                return
            outcome = _Refused(f"{outcome.reason} (after {tries} tries)")
        if isinstance(outcome, _Refused):
            log.warning("scheduler: batch job %s refused: %s", view.id, outcome.reason)
            await self._append(decide.submit_failed(view, outcome.reason), view)
            self.stats.submit_failed += 1
            await settle(msg, ACK, "scheduler")
            return
        landed = await self._record_submission(view, outcome)
        if landed is None or landed.final:
            await settle(msg, ACK, "scheduler")
        else:
            self.tracked[view.id] = Tracked(landed, msg)

    async def _submit_to_scheduler(self, view: BatchView) -> str | _Refused | _Retry:
        cfg = self._cfg
        plan = decide.plan_submission(
            view, queue=cfg.queue, project=cfg.project, site_options=cfg.options,
            request_options=frozenset(cfg.request_options),
        )  # fmt: skip
        if isinstance(plan, str):
            return _Refused(plan)
        template = self._settings.site_path(cfg.template)
        try:
            values = pilot_values(
                batch_id=view.id, site=self._site, site_dir=self._settings.directory,
                request=view.request, queue=plan.queue, project=plan.project,
                scheduler=self.scheduler.name,
            )  # fmt: skip
            text = await asyncio.to_thread(read_template, template)
            check_passes_filter(text, view.request, name=str(template))
            body = render(text, values, name=str(template))
            request = BatchRequest(
                project=plan.project, queue=plan.queue, nodes=view.request.num_nodes,
                wall_time_min=view.request.wall_time_min, job_name=decide.job_name(view.id),
                options=plan.options, env={"LODE_BATCH_JOB_ID": str(view.id)},
            )  # fmt: skip
            # The adapter checks every rendered word: a request's value that its scheduler
            # would read as syntax is refused here, before a script is written or run.
            script = self.scheduler.render_script(body, request)
        except (TemplateError, InvalidSubmission) as exc:
            return _Refused(str(exc))
        try:
            path = await asyncio.to_thread(self._write_script, view.id, script)
            return await asyncio.to_thread(self.scheduler.submit_request, path, request)
        except (SubmitRejected, InvalidSubmission, SchedulerUnavailable) as exc:
            return _Refused(str(exc))  # the scheduler's own words
        except SchedulerError as exc:  # hung or garbled: it may still have been queued
            return _Retry(str(exc))
        except OSError as exc:
            return _Refused(f"cannot write the batch script: {exc}")

    def _write_script(self, batch_id: uuid.UUID, script: str) -> Path:
        directory = self._settings.site_path(self._cfg.script_dir)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"pilot-{batch_id}.sh"
        path.write_text(script)  # schedulers read it (sbatch copies it): no execute bit needed
        return path.absolute()

    async def _record_submission(self, view: BatchView, scheduler_id: str) -> BatchView | None:
        """Append ``batch.submitted``; the view it leaves, or None if the job is not ours."""
        append = decide.submitted(view, self.scheduler.name, scheduler_id, view.last_seq)
        landed = await self._append(append, view)
        if landed is not None and landed.scheduler_id == scheduler_id:
            self.stats.submitted += 1
            log.info("scheduler: batch job %s submitted as %s %s", view.id,
                     self.scheduler.name, scheduler_id)  # fmt: skip
            return landed
        # Someone else recorded another submission (or the batch job ended): ours must go.
        log.warning("scheduler: batch job %s already recorded otherwise; cancelling %s",
                    view.id, scheduler_id)  # fmt: skip
        with contextlib.suppress(SchedulerError):
            await asyncio.to_thread(self.scheduler.delete, scheduler_id)
        return landed

    async def _find_at_scheduler(self, batch_id: uuid.UUID) -> str | None:
        statuses = await asyncio.to_thread(self.scheduler.status)
        return decide.find_submitted(statuses, batch_id)

    # --- deletions --------------------------------------------------------------------------

    async def _on_deletion(self, event: Event, msg: Any) -> None:
        view = await self._view(event.aggregate_id)
        if view is None:
            raise Untrusted(f"deletion of batch job {event.aggregate_id}, never requested")
        step = decide.on_deletion(view)
        try:
            if step is DeletionStep.CANCEL:
                assert view.scheduler_id is not None
                asked = await asyncio.to_thread(self.scheduler.delete, view.scheduler_id)
                self.stats.cancelled += int(asked)
                what = "cancelled" if asked else "had already ended"
                log.info("scheduler: batch job %s (%s %s) %s", view.id, self.scheduler.name,
                         view.scheduler_id, what)  # fmt: skip
                if (held := self.tracked.get(view.id)) is not None:
                    held.view = view
            elif step is DeletionStep.END_UNSUBMITTED:
                # A submission that timed out may have reached the scheduler after all.
                found = await self._find_at_scheduler(view.id)
                note = ""
                if found is not None:
                    await asyncio.to_thread(self.scheduler.delete, found)
                    note = f"{self.scheduler.name} job {found} cancelled"
                await self._append(decide.ended_unsubmitted(view, note), view)
        except SchedulerError as exc:
            self._scheduler_error(f"deleting batch job {view.id}", exc)
            await settle(msg, Nak(self._retry_s), "scheduler")
            return
        await settle(msg, ACK, "scheduler")

    # --- syncs ------------------------------------------------------------------------------

    async def sync(self) -> None:
        """Append what changed at the scheduler for every active batch job; never raises
        for a scheduler or NATS failure (logged, counted, tried again next time)."""
        for tracked in self.tracked.values():
            await settle(tracked.msg, HOLD, "scheduler")  # still ours: no redelivery
        ids = [t.view.scheduler_id for t in self.tracked.values() if t.view.scheduler_id]
        if not ids:
            return
        try:
            statuses = await asyncio.to_thread(self.scheduler.status, ids)
        except SchedulerError as exc:
            self._scheduler_error("status", exc)
            return
        for batch_id, tracked in list(self.tracked.items()):
            try:
                await self._sync_one(batch_id, tracked, statuses)
            except SchedulerError as exc:
                self._scheduler_error(f"accounting of batch job {batch_id}", exc)
            except Exception as exc:  # one batch job's NATS outage must not stop the others'
                if not transient(exc):
                    raise
                log.warning("scheduler: sync of batch job %s: %s", batch_id, first_line(exc))

    async def _sync_one(self, batch_id: uuid.UUID, tracked: Tracked, statuses: Any) -> None:
        scheduler_id = tracked.view.scheduler_id
        assert scheduler_id is not None
        status = statuses.get(scheduler_id)
        script_dir = self._settings.site_path(self._cfg.script_dir)
        pilot_end = read_pilot_end(pilot_end_path(script_dir, batch_id))
        if status is not None:
            tracked.misses = 0
            append = decide.on_status(tracked.view, status, pilot_end=pilot_end)
        else:
            absence = decide.on_absent(
                tracked.view, await self._accounting(scheduler_id),
                misses=tracked.misses, vanish_after=self._cfg.vanish_after, pilot_end=pilot_end,
            )  # fmt: skip
            tracked.misses += int(absence.missed)
            append = absence.append
        if append is None:
            return
        before = self.appended
        view = await self._append(append, tracked.view, rebase=False)
        if view is None:
            return
        self.stats.synced += self.appended - before
        tracked.view = view
        if view.final:
            log.info("scheduler: batch job %s ended: %s", batch_id, view.state)
            del self.tracked[batch_id]
            await settle(tracked.msg, ACK, "scheduler")

    async def _accounting(self, scheduler_id: str) -> BatchRecord | None:
        try:
            return await asyncio.to_thread(self.scheduler.accounting, scheduler_id)
        except (UnknownBatchJob, NotSupported):
            return None

    # --- the log ----------------------------------------------------------------------------

    async def _view(self, batch_id: uuid.UUID) -> BatchView | None:
        return await read_batch_job(self._js, self._site, batch_id)

    async def _append(
        self, append: Append, view: BatchView, *, rebase: bool = True
    ) -> BatchView | None:
        """Append on the batch job's chain; the view after it (re-read after a conflict).

        With ``rebase``, an event that stays true whatever came meanwhile (a submission, a
        refusal: facts about the scheduler) is chained again on the newer events (a
        deletion request), unless it already landed or the batch job ended.
        """
        for _ in range(REBASES):
            appended = await commit_one(self._log, append)
            if appended is None:  # lost the compare-and-set: the batch job moved on
                fresh = await self._view(view.id)
                if fresh is None or not rebase or fresh.final:
                    return fresh
                if append.event.type == "batch.submitted" and fresh.scheduler_id is not None:
                    return fresh  # landed already (a retry), or someone else's submission
                view, append = fresh, Append(append.event, fresh.last_seq)
                continue
            self.appended += 1
            return apply_batch(view, appended.seq, append.event)
        return await self._view(view.id)

    def _scheduler_error(self, what: str, exc: SchedulerError) -> None:
        self.stats.scheduler_errors += 1
        log.warning("scheduler: %s failed: %s: %s", what, type(exc).__name__, exc)


@dataclass(frozen=True, slots=True)
class _Refused:
    reason: str


@dataclass(frozen=True, slots=True)
class _Retry:
    reason: str
