"""The site agent's transfer module: moves transfer items and reports each one's end.

    xfer-<site>: xfer.requested → pool → (batched by location and direction) backend.submit
                                        → xfer.submitted (task id, attempt), per item
    every poll_interval_s: backend.poll(task) → xfer.succeeded (bytes, duration)
                                              | another attempt (transient, within the budget)
                                              | xfer.failed (permanent, or the budget spent)
                           for each item as soon as the backend says it settled, task running
                           or not

**A backend of this machine is not kept waiting for the cycle.** Where a backend polls at a
pace of its own (``TransferBackend.poll_every_s``: local and rsync, whose tasks run in this
process), its tasks in flight are polled at that pace between cycles, and its batches are
submitted as soon as a fetch leaves the feed empty (fewer deliveries than asked): items
fetched together are still pooled and batched together, and a small copy is reported in a
fraction of a second instead of one or two ``poll_interval_s``. Globus keeps the cycle: each
of its polls is a rate-limited request, and its items pool longer into fewer tasks.

The controller requests the items and ends the job's step when its last item settles
(:mod:`lodestream.services.controller.staging`); this module only moves data and reports.

**An item is work in progress of ``xfer-<site>`` from its request to its end.** Its delivery
is acknowledged only after ``xfer.succeeded`` or ``xfer.failed`` is on the log; until then it
is held and marked in progress. An agent that stops hands held items back (nak); one that dies
has them redelivered after the consumer's ack wait. The next agent reads each item from the log
(:mod:`.history`) and polls a task already submitted instead of submitting again; a backend
given the same submission key twice does not move the data twice
(:mod:`lodestream.platform_adapters.transfers.base`).

**No item waits silently.** A location the site has no backend for, a backend that cannot be
built (Globus never logged in), a path outside the job's directory: the item fails at once with
the reason, and the controller fails its job with it. A backend that is away is retried at
every cycle; after ``retry_budget`` more tries the item fails with the backend's words.

**A refusal belongs to its own item.** Before a batch is submitted, its backend judges each
item alone (``check_item``: a relative path, a '..' out of the base): a refused item fails with
its own reason, the rest is submitted. A whole batch the service still refuses is submitted
again one task per item, so only the item refused fails (a refusal that is the location's, a
Globus consent, fails them all).

Every append is compare-and-set on the item's last event, with an id derived from the item and
the attempt, so two agents cannot both report an item, and deciding again lands nothing twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from lodestream.agents.site.settings import SiteSettings
from lodestream.agents.site.transfers import plan
from lodestream.agents.site.transfers.history import ItemView, read_item
from lodestream.agents.site.transfers.locations import BackendBuilder, Backends
from lodestream.agents.site.transfers.stage_cache import StageCache, cache_key
from lodestream.agents.site.transfers.tracking import Held, InFlight, TransferStats
from lodestream.eventlog import EventLog
from lodestream.eventlog.kernel import (
    ACK,
    HOLD,
    Append,
    commit_one,
    deliveries,
    hand_back,
    settle,
)
from lodestream.eventlog.pull import PullLoop, pull_consumer, stream_seq, work_and_tick
from lodestream.eventlog.transient import transient
from lodestream.platform_adapters.transfers.base import (
    ConsentRequired,
    TaskStatus,
    TransferBackend,
    TransferError,
    TransferRefused,
    UnknownTask,
)
from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import Untrusted, first_line
from lodestream.schemas.events import (
    TransferFailed,
    TransferRequested,
    TransferSubmitted,
    TransferSucceeded,
)
from lodestream.schemas.events.xfer import (
    TransferDoneData,
    TransferFailedData,
    TransferSubmittedData,
)
from lodestream.schemas.ids import derived_id
from lodestream.schemas.topology import XFER
from lodestream.schemas.trust import check_own_site, event_from_message

log = logging.getLogger(__name__)

PROGRESS_EVERY_S: Final = 30.0  # in_progress on held deliveries (the feed's ack wait is 120 s)
FETCH_BATCH: Final = 256
FETCH_WAIT_S: Final = 0.5  # a fetch's wait for its first delivery, but for a quick backend's pace


class TransferModule:
    def __init__(
        self,
        js: Any,
        settings: SiteSettings,
        *,
        build: BackendBuilder | None = None,
        durable: str | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._js = js
        self._log = EventLog(js)
        self._site = settings.site
        self._cfg = settings.transfers
        self._data_dir = settings.data_dir.resolve()
        self._durable = durable or XFER.durable(settings.site)
        self.backends = Backends(settings, build)
        self._clock = clock
        self.held: dict[uuid.UUID, Held] = {}
        self.inflight: dict[str, InFlight] = {}
        cfg = self._cfg
        self.cache = StageCache(
            settings.site_path(cfg.stage_cache_dir),
            max_bytes=cfg.stage_cache_bytes,
            ttl_s=cfg.stage_cache_ttl_s,
        )
        # A source being fetched → the items waiting for it (each source moves in once).
        self._fetching: dict[str, uuid.UUID] = {}
        self._waiting: dict[str, list[uuid.UUID]] = {}
        self.stats = TransferStats()
        # ``deliver`` holds or settles each delivery itself; the kernel terms what the shared
        # rule refuses and hands back what met NATS away (the feed's retry_s).
        self.consume = deliveries(self.deliver, "transfers", retry_s=XFER.retry_s,
                                  counts=self.stats.deliveries)  # fmt: skip
        self._progress_at = 0.0
        self._cycle_due = 0.0
        self._feed_drained = True  # the last fetch took fewer deliveries than it asked for

    @property
    def actor(self) -> str:
        return f"site:{self._site}"

    # --- the loop ---------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        sub = await pull_consumer(self._js, XFER.stream, self._durable)
        pulling = PullLoop(sub, name="transfers", batch=FETCH_BATCH, timeout_s=self._fetch_wait_s)
        try:
            # A tick after every fetch: ``tick`` runs the cycle when it is due, and the quick
            # backends' part of it between cycles.
            await work_and_tick(pulling, self._handle, self.tick, 0.0, stop)
        finally:
            await hand_back(sub, [held.msg for held in self.held.values()], "transfers")
            await asyncio.to_thread(self.backends.close)
            log.info("transfers stop: %s", self.stats)

    async def deliver(self, msg: Any) -> None:
        """One ``xfer.requested`` delivery: hold it, resume it, or let it go if it has ended.

        :class:`Untrusted` if it is no work here; NATS errors if the item cannot be read yet.
        """
        event = _request(msg, self._site)
        held = self.held.get(event.aggregate_id)
        if held is not None:  # redelivered while held here (a slow cycle): keep the newest
            held.msg = msg
            return
        view = await read_item(self._js, self._site, event.aggregate_id)
        view = view or ItemView(
            event.aggregate_id, event.data, stream_seq(msg), request_id=event.id
        )
        if view.final:
            await settle(msg, ACK, "transfers")
            return
        held = Held(view, msg)
        self.held[view.id] = held
        if view.task_id is not None:
            self.stats.resumed += 1
            self._adopt(held, view.task_id)
        else:
            await self._queue(held, attempt=1)

    async def _handle(self, msgs: list[Any]) -> None:
        await self.consume(msgs)
        self._feed_drained = len(msgs) < FETCH_BATCH

    async def tick(self) -> None:
        """After each fetch: the cycle every ``poll_interval_s``; between cycles, poll the
        quick backends' tasks at their pace and submit their batches once the feed is drained
        (see the module doc)."""
        drained, self._feed_drained = self._feed_drained, True  # an empty fetch drained it
        if time.monotonic() >= self._cycle_due:
            try:
                await self.cycle()
            finally:
                self._cycle_due = time.monotonic() + self._cfg.poll_interval_s
            return
        for task in list(self.inflight.values()):
            pace = self.backends.poll_every_s(task.location)
            if self._quick(task.location) and time.monotonic() - task.polled_mono >= pace:
                await self._poll(task)
        if drained:
            await self._submit_ready(quick_only=True)

    def _quick(self, location: str) -> bool:
        """Its backend polls at a pace of its own, quicker than the cycle (local, rsync)."""
        return self.backends.poll_every_s(location) < self._cfg.poll_interval_s

    def _fetch_wait_s(self) -> float:
        """How long a fetch may wait: not past the next poll of a quick backend's task (and
        as long as before while none is in flight: no busy loop)."""
        inflight = self.inflight.values()
        paces = [
            self.backends.poll_every_s(t.location) for t in inflight if self._quick(t.location)
        ]
        return min([FETCH_WAIT_S, *paces])

    async def cycle(self) -> None:
        """Poll what is in flight, submit what waits, keep held deliveries from redelivery."""
        for task in list(self.inflight.values()):
            await self._poll(task)
        await self._submit_ready()
        if time.monotonic() - self._progress_at >= PROGRESS_EVERY_S:
            self._progress_at = time.monotonic()
            for held in self.held.values():
                await settle(held.msg, HOLD, "transfers")

    # --- submitting -------------------------------------------------------------------------

    async def _queue(self, held: Held, *, attempt: int) -> None:
        request = held.view.request
        location = request.remote.location
        if self.backends.problem(location) is not None:
            await self._fail(held, self.backends.problem(location) or "", permanent=True)
            return
        try:
            site_path = self._site_path(request.local_path)
        except ValueError as exc:
            await self._fail(held, str(exc), permanent=True)
            return
        remote = request.remote.path
        source, destination = (remote, site_path) if request.direction == "in" else (
            site_path, remote)  # fmt: skip
        held.task_id = None
        if self.cache.enabled and request.cache and await self._from_cache(held, site_path):
            return
        held.pending = plan.PendingItem(
            item_id=held.view.id, location=location, direction=request.direction,
            source=source, destination=destination, recursive=request.remote.recursive,
            attempt=attempt, since_seq=held.view.last_seq, overwrite=request.overwrite,
            verify=request.verify, sha256=request.remote.sha256,
        )  # fmt: skip

    async def _from_cache(self, held: Held, site_path: str) -> bool:
        """Serve the item from the stage cache, or wait for a fetch of its source under way;
        False: this item fetches it."""
        key = cache_key(held.view.request.remote.location, held.view.request.remote.path)
        cached = self.cache.lookup(key)
        if cached is not None:
            try:
                await asyncio.to_thread(self.cache.serve, key, Path(site_path))
            except OSError as exc:  # the workdir's filesystem refused: fetch it instead
                log.warning("transfers: stage cache could not serve %s: %s", key, exc)
            else:
                self.stats.cache_hits += 1
                await self._succeed(held, 0, cached=True)
                return True
        fetcher = self._fetching.get(key)
        if fetcher is not None and fetcher != held.view.id and fetcher in self.held:
            self.stats.cache_waits += 1
            held.pending = None
            self._waiting.setdefault(key, []).append(held.view.id)
            return True
        self._fetching[key] = held.view.id
        return False

    async def _fetched(self, held: Held, *, ok: bool) -> None:
        """The item that fetched a cacheable source ended: serve or hand on its waiters."""
        request = held.view.request
        key = cache_key(request.remote.location, request.remote.path)
        if self._fetching.get(key) != held.view.id:
            return
        del self._fetching[key]
        if ok:
            with contextlib.suppress(OSError, ValueError):
                path = Path(self._site_path(request.local_path))
                await asyncio.to_thread(self.cache.keep, key, path)
        for waiter in self._waiting.pop(key, []):
            waiting = self.held.get(waiter)
            if waiting is not None:  # served now if kept, else the first fetches it again
                await self._queue(waiting, attempt=max(waiting.view.attempt, 0) + 1)

    def _site_path(self, relative: str) -> str:
        path = (self._data_dir / relative).resolve()
        if not path.is_relative_to(self._data_dir):
            raise ValueError(f"transfer path {relative!r} leaves the site's data directory")
        return str(path)

    async def _submit_ready(self, *, quick_only: bool = False) -> None:
        """Submit the batches the free task slots take; ``quick_only`` (between cycles): only
        those of quick backends, the others' slots kept for the cycle, as the cycle would
        have chosen them."""
        pool = [h.pending for h in self.held.values() if h.pending is not None]
        if quick_only and not any(self._quick(item.location) for item in pool):
            return
        free = self._cfg.max_concurrent - len(self.inflight)
        spread = self.backends.spreading()
        for batch in plan.batches(
            pool, batch_size=self._cfg.batch_size, free_slots=free, spread=spread
        ):
            if not quick_only or self._quick_now(batch):
                await self._submit(batch)

    def _quick_now(self, batch: plan.Batch) -> bool:
        """Worth submitting between cycles: a quick backend's batch none of whose items it
        failed to take (those are tried again at each cycle: ``retry_budget`` counts cycles)."""
        return self._quick(batch.location) and not any(
            self.held[item.item_id].submit_errors for item in batch.items
        )

    async def _submit(self, whole: plan.Batch) -> None:
        backend = self.backends.get(whole.location)
        batch = await self._without_refused(backend, whole)
        if batch is None:
            return
        if batch.direction == "in":
            for item in batch.items:
                Path(item.destination).parent.mkdir(parents=True, exist_ok=True)
        request = batch.to_request(self.backends.url(batch.location))
        try:
            task_id = await asyncio.to_thread(backend.submit, request)
        except TransferRefused as exc:
            await self._refused(batch, exc)
            return
        except TransferError as exc:  # away, or its tool missing: try again next cycle
            self.stats.backend_errors += 1
            log.warning("transfers: submitting to %s failed: %s", batch.location, exc)
            for item in batch.items:
                held = self.held[item.item_id]
                held.submit_errors += 1
                if held.submit_errors > self._cfg.retry_budget:
                    await self._fail(held, f"{batch.location}: {exc}", permanent=False)
            return
        self.stats.tasks[batch.location] = self.stats.tasks.get(batch.location, 0) + 1
        self.inflight[task_id] = InFlight(task_id, batch.location, [], time.monotonic())
        for item in batch.items:
            held = self.held[item.item_id]
            if await self._submitted(held, task_id, item.attempt, len(batch.items)):
                self.inflight[task_id].items.append(item.item_id)
        if not self.inflight[task_id].items:
            del self.inflight[task_id]

    async def _without_refused(
        self, backend: TransferBackend, batch: plan.Batch
    ) -> plan.Batch | None:
        """``batch`` less the items its backend refuses, each failed with its own reason;
        None when it refuses them all."""
        request = batch.to_request(self.backends.url(batch.location))
        kept: list[plan.PendingItem] = []
        for pending, item in zip(batch.items, request.items, strict=True):
            try:
                backend.check_item(request, item)
            except TransferRefused as exc:
                await self._fail(self.held[pending.item_id], str(exc), permanent=True)
            else:
                kept.append(pending)
        if len(kept) == len(batch.items):
            return batch
        return replace(batch, items=tuple(kept)) if kept else None

    async def _refused(self, batch: plan.Batch, exc: TransferRefused) -> None:
        """The service refused the whole batch: fail its one item (or every item, for a
        refusal that is the location's), else submit each item in a task of its own."""
        if len(batch.items) == 1 or isinstance(exc, ConsentRequired):
            for item in batch.items:
                await self._fail(self.held[item.item_id], str(exc), permanent=True)
            return
        log.warning("transfers: %s refused a batch of %d items (%s); submitting each alone",
                    batch.location, len(batch.items), exc)  # fmt: skip
        for item in batch.items:
            self.held[item.item_id].pending = replace(item, alone=True)

    async def _submitted(self, held: Held, task_id: str, attempt: int, size: int) -> bool:
        event = TransferSubmitted.create(
            site=self._site, aggregate_id=held.view.id, actor=self.actor,
            data=TransferSubmittedData(task_id=task_id, attempt=attempt, items_in_task=size),
            event_id=self._id(held, f"submitted-{attempt}"), causation_id=held.view.request_id,
        )  # fmt: skip
        if not await self._append(held, event):
            return False
        self.stats.submitted += 1
        held.pending, held.task_id = None, task_id
        held.submitted_mono = time.monotonic()
        held.view = replace(held.view, task_id=task_id, attempt=attempt,
                            submitted_at=self._clock())  # fmt: skip
        return True

    def _adopt(self, held: Held, task_id: str) -> None:
        location = held.view.request.remote.location
        task = self.inflight.setdefault(task_id, InFlight(task_id, location, []))
        task.items.append(held.view.id)
        held.task_id = task_id
        submitted = held.view.submitted_at
        ago = (self._clock() - submitted).total_seconds() if submitted else 0.0
        held.submitted_mono = time.monotonic() - max(ago, 0.0)

    # --- polling ----------------------------------------------------------------------------

    async def _poll(self, task: InFlight) -> None:
        task.polled_mono = time.monotonic()
        if time.monotonic() - task.submitted_mono < self._cfg.simulated_task_latency_s:
            return
        problem = self.backends.problem(task.location)
        if problem is not None:  # settings changed under a resumed task
            for item in task.items:
                await self._fail(self.held[item], problem, permanent=True)
            del self.inflight[task.task_id]
            return
        backend = self.backends.get(task.location)
        try:
            status = await asyncio.to_thread(backend.poll, task.task_id)
        except UnknownTask:
            status = TaskStatus(task.task_id, final=True, detail="the backend forgot the task")
        except TransferError as exc:
            self.stats.backend_errors += 1
            log.warning("transfers: polling task %s failed: %s", task.task_id, exc)
            # Back to the cycle's pace for a while: a record that cannot be read now is no
            # reason to warn ten times a second.
            task.polled_mono = time.monotonic() + self._cfg.poll_interval_s
            return
        if not status.final:
            await self._settle_early(task, status)
            return
        del self.inflight[task.task_id]
        for missing in plan.missing_items(task.items, status.items):
            log.warning("transfers: task %s ended saying nothing of item %s (%s)",
                        task.task_id, missing, status.detail or "no detail")  # fmt: skip
        for item_id in task.items:
            held = self.held.get(item_id)
            if held is not None:
                await self._settle_item(held, status)

    async def _settle_early(self, task: InFlight, status: TaskStatus) -> None:
        """Report the items a running task has already settled: a job waits for its own
        items, not for the last item of every task they share. The task keeps its slot until
        it ends."""
        for item_id in [item for item in task.items if str(item) in status.items]:
            held = self.held.get(item_id)
            if held is not None:
                await self._settle_item(held, status)
            held = self.held.get(item_id)
            if held is None or held.task_id != task.task_id:  # else not appended: next poll
                task.items.remove(item_id)

    async def _settle_item(self, held: Held, status: TaskStatus) -> None:
        result = status.items.get(str(held.view.id))
        if result is None:
            await self._retry(held, f"task {status.task_id}: {status.detail or 'no outcome'}")
            return
        decision = plan.outcome(result, attempt=held.view.attempt,
                                retry_budget=self._cfg.retry_budget)  # fmt: skip
        if decision.verdict == "succeeded":
            await self._succeed(held, result.bytes_transferred)
        elif decision.verdict == "retry":
            await self._retry(held, decision.reason)
        else:
            await self._fail(held, decision.reason, permanent=decision.permanent)

    async def _retry(self, held: Held, reason: str) -> None:
        if held.view.attempt > self._cfg.retry_budget:
            await self._fail(
                held, f"{reason} (after {held.view.attempt} attempts)", permanent=False
            )
            return
        self.stats.retried += 1
        log.info("transfers: item %s attempt %d failed (%s); trying again",
                 held.view.id, held.view.attempt, reason)  # fmt: skip
        await self._queue(held, attempt=held.view.attempt + 1)

    # --- ends -------------------------------------------------------------------------------

    async def _succeed(self, held: Held, size: int | None, *, cached: bool = False) -> None:
        took = max(time.monotonic() - held.submitted_mono, 0.0) if held.submitted_mono else None
        event = TransferSucceeded.create(
            site=self._site, aggregate_id=held.view.id, actor=self.actor,
            data=TransferDoneData(bytes_transferred=size, duration_s=None if cached else took,
                                  attempts=max(held.view.attempt, 1), cached=cached),
            event_id=self._id(held, "succeeded"), causation_id=held.view.request_id,
        )  # fmt: skip
        if await self._append(held, event):
            self.stats.succeeded += 1
            await self._release(held)
            if held.view.request.cache and not cached:
                await self._fetched(held, ok=True)

    async def _fail(self, held: Held, reason: str, *, permanent: bool) -> None:
        event = TransferFailed.create(
            site=self._site, aggregate_id=held.view.id, actor=self.actor,
            data=TransferFailedData(reason=reason[:4096], permanent=permanent,
                                    attempts=max(held.view.attempt, 1)),
            event_id=self._id(held, "failed"), causation_id=held.view.request_id,
        )  # fmt: skip
        if await self._append(held, event):
            self.stats.failed += 1
            log.warning("transfers: item %s (%s of job %s) failed: %s", held.view.id,
                        held.view.request.slot, held.view.request.job_id, reason)  # fmt: skip
            await self._release(held)
            if held.view.request.cache:
                await self._fetched(held, ok=False)

    async def _release(self, held: Held) -> None:
        self.held.pop(held.view.id, None)
        await settle(held.msg, ACK, "transfers")

    async def _append(self, held: Held, event: Event) -> bool:
        """Append on the item's last event; False if the item moved on (then it is re-read)."""
        try:
            appended = await commit_one(self._log, Append(event, held.view.last_seq))
        except Exception as exc:  # NATS away: the next cycle decides again
            if not transient(exc):
                raise
            log.warning("transfers: could not append %s: %s", event.type, first_line(exc))
            return False
        if appended is None:  # lost the compare-and-set: the item moved on
            fresh = await read_item(self._js, self._site, held.view.id)
            if fresh is None or fresh.final:
                await self._release(held)  # someone else ended it
            else:
                held.view = fresh
            return False
        held.view = replace(held.view, last_seq=appended.seq)
        return True

    def _id(self, held: Held, what: str) -> uuid.UUID:
        return derived_id("xfer", self._site, str(held.view.id), what)


def _request(msg: Any, site: str) -> TransferRequested:
    event = check_own_site(event_from_message(msg.subject, msg.data), site)
    if not isinstance(event, TransferRequested):
        raise Untrusted(f"{event.type} is not work of {XFER.durable(site)}")
    return event
