"""The pilot: lease runnable work for its site, pack it on its nodes, run it, report it.

Every job goes through one chain of compare-and-set appends:

    runnable event (seq s0) ──job.started(skipped: leased)──▶ s1 ──job.run_done|errored──▶ s2

``job.started`` with expect=s0 *is* the lease: exactly one launcher wins it.
A successful run that nothing follows (no ``postprocess`` hook, no stage-out)
is reported as ``job.finished`` standing for ``job.run_done`` too, with the
run's result in it: one event fewer per job on the common path.
The result chains on s1; if that append conflicts, the controller expired
the lease in between (the pilot was paused or cut off) — the pilot was
fenced, and its task is killed at once.

A NATS outage is not a verdict. Tasks keep running while the client
reconnects; appends that got no answer are retried with the same event id
until they land or are refused; the pilot leases nothing while its heartbeat
is unacknowledged for longer than the TTL. Only when the controller has
expired the session (``session.lost``) does the pilot kill everything it runs:
its jobs belong to someone else now.

Every delivery is checked with the shared rule before the pilot acts on it
(:func:`lodestream.agents.launcher.work.work_item`); what fails it is terminated, logged
and counted, and the pilot keys what it holds by (site, job id).

A pilot with a tag filter (``--tag key:value``, :mod:`~lodestream.agents.launcher.tags`)
hands every job outside it back to the consumer, unleased, for a pilot whose filter it
matches (:func:`~lodestream.agents.launcher.decide.outside_filter`), and counts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import time
import uuid
from collections.abc import Awaitable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Final

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from lodestream.agents.launcher import decide
from lodestream.agents.launcher.appends import KEPT, append_or_keep, append_patiently
from lodestream.agents.launcher.config import PilotConfig, PilotParts
from lodestream.agents.launcher.decide import (
    AfterStart,
    Offer,
    Outcome,
    Redelivery,
    Refusal,
)
from lodestream.agents.launcher.diffusion import count
from lodestream.agents.launcher.errors import ExpiredBeforeOpened
from lodestream.agents.launcher.jobs import job_start, make_workdir, run_end
from lodestream.agents.launcher.reads import created_spec
from lodestream.agents.launcher.refusals import note_refusal
from lodestream.agents.launcher.report import ExitReason, LauncherReport
from lodestream.agents.launcher.session import LauncherSession
from lodestream.agents.launcher.tags import describe
from lodestream.agents.launcher.tasks import Reaper, Tracked
from lodestream.agents.launcher.watch import JobWatch
from lodestream.agents.launcher.work import (
    JobKey,
    NotRunnable,
    NotWork,
    WorkItem,
    work_item,
)
from lodestream.agents.site.apps import to_app_model
from lodestream.agents.site.retry import retry_until, stopped_within
from lodestream.agents.site.settings import JobMode
from lodestream.eventlog import ConflictError, EventLog
from lodestream.eventlog.kernel import ACK, TERM, Nak, deliveries, settle
from lodestream.eventlog.pull import PullLoop, pull_consumer
from lodestream.eventlog.transient import transient
from lodestream.platform_adapters.errors import ResourceError, StartFailed
from lodestream.platform_adapters.launchers.base import AppLauncher, RunningTask, TaskSpec
from lodestream.platform_adapters.packing import Allocation, JobRequest, NodePacker
from lodestream.schemas.envelope import Event
from lodestream.schemas.events import JobStarted
from lodestream.schemas.resources import NodeInfo
from lodestream.schemas.retry import MAX_BACKOFF_S
from lodestream.schemas.topology import KILLS, LAUNCH, PEERS

__all__ = ["Launcher", "LauncherReport"]

log = logging.getLogger(__name__)
NAME: Final = "launcher"  # in the log lines of the consumer kernel
NAK_DELAY_S = 0.5
# A runnable event whose job.created is not found is refused only at its 5th delivery (a
# few seconds on): a lagging replica catches up by then, a forged event stays forged.
MISSING_CREATED_DELIVERIES = 5
MISSING_CREATED_NAK_DELAY_S = 1.0
# A job this pilot can never run: a pilot that can gets it back within this; meanwhile the
# site's pilots do not hand it round twice a second.
REFUSED_NAK_DELAY_S = 5.0
REFUSALS_REMEMBERED = 10_000  # jobs whose refusal (or hand-back) was logged, once each
LAPSED_POLL_S = 0.25
# How long a fetch waits for a delivery: 0.25 s on average, varied so that pilots' pull
# requests do not stay in step. The server gives a delivery to the oldest open request; in
# step, one pilot's would be the oldest every time, and a job it hands back (outside its tag
# filter) would come back to it every time, not to the pilot that wants it.
FETCH_WAIT_S: Final = (0.15, 0.35)


class Launcher:
    def __init__(
        self,
        js: JetStreamContext,
        session: LauncherSession,
        pilot: PilotConfig,
        parts: PilotParts,
        *,
        nc: Any = None,
    ) -> None:
        self._js = js
        self._outbox = parts.outbox
        self._nc = nc
        self._log = EventLog(js)
        self._site = pilot.site
        self.session = session
        self._apps = parts.apps
        # Their published interface: which steps follow a run (shared with the controller).
        self._app_models = {name: to_app_model(cls, pilot.site) for name, cls in parts.apps.items()}
        self._app_launcher = parts.app_launcher
        self._nodes = pilot.nodes
        self._packer = NodePacker(pilot.nodes)
        self._mode: JobMode = pilot.mode
        self._site_shape = pilot.site_shape
        self._mpi_broken = pilot.mpi_broken
        self._refusals_logged: set[JobKey] = set()
        # Only jobs whose tags include all of these are leased here; empty: every job.
        self._filter_tags = dict(pilot.filter_tags)
        self._hand_backs_logged: set[JobKey] = set()
        self._data_dir = pilot.data_dir
        self._idle_ttl_s = pilot.idle_ttl_s
        self._idle_from = 0.0  # monotonic: not idle before a deferred retry falls due
        self._max_fetch = pilot.max_fetch
        self._base_env = dict(pilot.base_env)
        self._batch = pilot.batch
        self._diffusion = parts.diffusion
        self._reaper = Reaper()
        self._warm = parts.warm
        self._jobs: set[asyncio.Task[None]] = set()
        # What we hold, from the offer until the task is reported: one entry per job.
        self._held: dict[JobKey, WorkItem] = {}
        # Jobs holding an allocation: from the offer until their task has ended.
        self._placed: set[JobKey] = set()
        # The last sequence of our CAS chain; present only while we may still report.
        self._chains: dict[JobKey, int] = {}
        self._freed = asyncio.Event()
        self._draining = False
        self._drain_until = 0.0
        # When the pilot was told to stop (monotonic): a task that dies about then died of it.
        self._stopping = asyncio.Event()
        self._stopped_at: float | None = None
        self._revoked = False
        self.report = LauncherReport()
        # ``_offer`` settles or holds each delivery itself; the kernel hands back one that
        # met NATS away, and logs (and leaves for redelivery) one that met a bug.
        self._each_delivery = deliveries(self._offer, NAME, retry_s=NAK_DELAY_S)
        self._watch = JobWatch(js, pilot.site, chains=self._chains, stop_task=self._stop_task,
                               report=self.report)  # fmt: skip

    # --- lifecycle ------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> LauncherReport:
        warming = None if self._warm is None else asyncio.create_task(self._warm.open())
        try:
            return await self._run_opened(stop)
        finally:
            if warming is not None:
                await warming
            if self._warm is not None:
                self._warm.close()

    async def _run_opened(self, stop: asyncio.Event) -> LauncherReport:
        unopened = await self._open(stop)
        if unopened is not None:
            self.report.exit_reason = unopened
            return self.report
        reaper_stop = asyncio.Event()
        beat_stop = asyncio.Event()
        background = [
            asyncio.create_task(self._reaper.run(reaper_stop)),
            asyncio.create_task(self.session.heartbeat_forever(self._stats, beat_stop)),
            asyncio.create_task(self._watch.check_forever(self.session.ttl_s, beat_stop)),
            asyncio.create_task(self._note_stop(stop, beat_stop)),
        ]
        kills = await self._subscribe_live()
        try:
            self.report.exit_reason = await self._lease_loop(stop)
        finally:
            if self.session.lost:
                self._kill_all("session lost: the controller expired it")
            elif self._revoked:
                self.report.exit_reason = ExitReason.REVOKED
                self._kill_all("the site's credential was revoked: nothing can be reported")
            else:
                await self._drain(self.report.exit_reason)
            if self._jobs:
                await asyncio.gather(*self._jobs, return_exceptions=True)
            for kill_sub in kills:
                with contextlib.suppress(nats.errors.Error):
                    await kill_sub.unsubscribe()
            reaper_stop.set()
            beat_stop.set()
            await asyncio.gather(*background, self._watch.settled(), return_exceptions=True)
            if not self.session.lost and not self._revoked:
                await self.session.close(self.report.exit_reason)
            if self._diffusion is not None:  # node-local disks are the next batch job's
                await asyncio.to_thread(self._diffusion.cache.close)
        return self.report

    async def _subscribe_live(self) -> list[Any]:
        """The live feeds: kills, and (with caches) what the site's other pilots cache."""
        subs = []
        if self._nc is not None:
            for subject in KILLS.filter_subjects(self._site):
                subs.append(await self._nc.subscribe(subject, cb=self._watch.on_killed))
            if self._diffusion is not None:
                self.session.cached = self._diffusion.cache.digest
                peers = self._diffusion.peers
                for subject in PEERS.filter_subjects(self._site):
                    subs.append(await self._nc.subscribe(subject, cb=peers.on_message))
        return subs

    async def _open(self, stop: asyncio.Event) -> ExitReason | None:
        """Open the session, retrying (logged, with backoff); else why it was not opened."""
        nodes = [NodeInfo(hostname=n.hostname, cores=max(len(n.cpu_ids), 1), gpus=len(n.gpu_ids))
                 for n in self._nodes]  # fmt: skip

        async def attempt() -> bool:
            await self.session.open(socket.gethostname(), self._mode, nodes)
            return True

        while True:
            try:
                opened = await self._beating(
                    retry_until(
                        f"session {self.session.id}: open",
                        attempt,
                        retryable=transient,
                        stop=stop,
                        deadline=self.session.deadline,
                    )
                )
            except ExpiredBeforeOpened as exc:  # it held nothing: a new session loses nothing
                self.session.renew()
                log.warning("launcher: %s (its heartbeat lapsed while the open was retried); "
                            "opening session %s", exc, self.session.id)  # fmt: skip
                continue
            except ConflictError:  # a fresh random id already in use: nothing to retry
                log.exception("launcher: cannot open session %s", self.session.id)
                return ExitReason.SESSION_REFUSED
            if opened is None:
                return ExitReason.STOPPED if stop.is_set() else ExitReason.WALL_TIME
            return None

    async def _beating(self, opening: Awaitable[bool | None]) -> bool | None:
        """Await the open with heartbeats going on: the pauses between its tries grow past
        the TTL (a leader election), and a heartbeat that stops then gets the session expired
        by the controller before it is even opened."""
        beat_stop = asyncio.Event()
        beats = asyncio.create_task(self.session.heartbeat_forever(self._stats, beat_stop))
        try:
            return await opening
        finally:
            beat_stop.set()
            await asyncio.gather(beats, return_exceptions=True)

    def reconnected(self) -> None:
        """NATS is back: beat at once, and learn what we missed while we could not hear."""
        self.session.wake()
        self._watch.reconnected()

    def revoked(self) -> None:
        """NATS refuses the site's credential for good: when the pilot stops, it kills its
        tasks (their results could never be appended) and stops retrying appends."""
        self._revoked = True

    async def _lease_loop(self, stop: asyncio.Event) -> ExitReason:
        sub = await pull_consumer(self._js, LAUNCH.stream, LAUNCH.durable(self._site))
        pulling = PullLoop(sub, name="launcher", batch=self._fetch_size, timeout_s=_fetch_wait_s)
        idle_since = time.monotonic()
        try:
            while not stop.is_set():
                if self.session.lost:
                    return ExitReason.SESSION_LOST
                if self.session.remaining_min() <= 0:
                    return ExitReason.WALL_TIME
                if self._jobs:
                    idle_since = time.monotonic()
                elif time.monotonic() - max(idle_since, self._idle_from) > self._idle_ttl_s:
                    return ExitReason.IDLE
                if self.session.lapsed:
                    # Unacknowledged heartbeats for a TTL: lease nothing until we know whether
                    # the controller expired us. Running tasks go on meanwhile.
                    await stopped_within(stop, LAPSED_POLL_S)
                    continue
                if self._packer.idle_node_count == 0 and not self._has_free_cpu():
                    self._freed.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._freed.wait(), 0.5)
                    continue
                await self._fetch_and_offer(pulling)
            return ExitReason.STOPPED
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.stop()

    async def _fetch_and_offer(self, pulling: PullLoop[Msg]) -> None:
        # No message stops the pilot: one whose offer fails is logged and, unsettled, redelivered.
        await pulling.once(self._each_delivery)

    def _fetch_size(self) -> int:
        # Every job offered holds its allocation from the lease on, not only once it runs:
        # fetching more than that would hand the surplus back (nak) and delay it.
        free = sum(max(len(n.cpu_ids), 1) for n in self._nodes) - len(self._placed)
        return max(1, min(self._max_fetch, free))

    def _has_free_cpu(self) -> bool:
        return any(node.fits(1, 0, 0.0) for node in self._packer.nodes)

    def _stats(self) -> tuple[int, int, int]:
        free = sum(n.idle_cpu_count for n in self._packer.nodes)
        return len(self._reaper), len(self._jobs), free

    # --- deliveries -----------------------------------------------------------------------

    async def _offer(self, msg: Any) -> None:
        work = await self._work(msg)
        if work is None:
            return
        item, request = work
        held = self._held.get(item.key)
        if held is not None:
            await self._redelivered(item, held)
            return
        wait = item.wait_s(datetime.now(UTC))
        # The filter before the retry's wait: that is for the pilot that takes it.
        if await self._outside_filter(item, msg, wait) or await self._not_due(item, wait):
            return
        refused = decide.refusal(request, mode=self._mode, pilot_nodes=len(self._nodes),
                                 never_fits=self._packer.can_ever_fit(request),
                                 site=self._site_shape, mpi_broken=self._mpi_broken)  # fmt: skip
        placing = decide.offer(item.spec, refused=refused,
                               remaining_min=self.session.remaining_min())  # fmt: skip
        if refused is not None:  # NEVER_FITS here, or NOWHERE at this site
            await self._refuse(item, refused)
            return
        prefer = await self._cache_preference(item, msg) if placing is Offer.PLACE else []
        if prefer is None:  # a peer's caches hold its inputs: that pilot's to take
            return
        allocation = self._packer.allocate(request, prefer) if placing is Offer.PLACE else None
        if allocation is None:  # elsewhere, or here once our nodes free up
            await settle(msg, Nak(NAK_DELAY_S), NAME)
            return
        self._held[item.key] = item
        self._placed.add(item.key)
        job = asyncio.create_task(self._run_job(item, allocation))
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)

    async def _work(self, msg: Any) -> tuple[WorkItem, JobRequest] | None:
        """The work ``msg`` carries, or None once a delivery that carries none is settled."""
        try:
            item = work_item(msg, self._site)
            return item, JobRequest.from_resources(str(item.job_id), item.spec)
        except NotRunnable:  # the controller moves it on; its runnable event comes later
            self.report.not_runnable += 1
            await settle(msg, ACK, NAME)
        except (NotWork, ResourceError) as exc:
            await self._skip(msg, str(exc))
        return None

    async def _outside_filter(self, item: WorkItem, msg: Any, wait: float) -> bool:
        """Hand the job back if it is outside this pilot's tag filter; True if handed back."""
        if not self._filter_tags:
            return False
        back = decide.outside_filter(
            item.spec.tags, self._filter_tags, idle_ttl_s=self._idle_ttl_s,
            deliveries=int(msg.metadata.num_delivered),
            jitter=random.random(),  # noqa: S311 - jitter, not a secret
            not_due_s=min(wait, MAX_BACKOFF_S),
        )  # fmt: skip
        if back is None:
            return False
        await self._hand_back(item, back)
        return True

    async def _cache_preference(self, item: WorkItem, msg: Any) -> list[str] | None:
        """The nodes whose caches hold the job's inputs, first; None if the job was handed
        back because a live peer's caches hold them (data-aware dispatch)."""
        if self._diffusion is None:
            return []
        delay, prefer = self._diffusion.placing(item)
        if delay is not None:
            self.report.cache_deferred += 1
            await settle(msg, Nak(delay), NAME)
            return None
        return prefer

    async def _hand_back(self, item: WorkItem, back: decide.HandBack) -> None:
        """Outside our tag filter: another pilot's to take. Never leased here, so it holds
        no allocation and nothing waits on it; the consumer offers it again after the delay."""
        self.report.filtered += 1
        if _first_time(self._hand_backs_logged, item.key):
            log.info("launcher: job %s is left to other pilots: %s (this pilot's filter: %s)",
                     item.job_id, back.reason, describe(self._filter_tags))  # fmt: skip
        await settle(item.msg, Nak(back.delay_s), NAME)

    async def _refuse(self, item: WorkItem, refused: Refusal) -> None:
        """Not for this pilot: leave it to another (nak), or fail it if no pilot can run it."""
        if _first_time(self._refusals_logged, item.key):  # once per job, not per redelivery
            self.report.refused += 1
            log.warning("launcher: job %s is not for this pilot: %s", item.job_id, refused.reason)
        if not refused.nowhere:
            # On record once per runnable event (refusals.py): the job's history says why.
            noted = not item.refused and await note_refusal(
                self._log, item, session_id=self.session.id, actor=self.session.actor,
                reason=refused.reason,
            )  # fmt: skip
            await settle(item.msg, ACK if noted else Nak(REFUSED_NAK_DELAY_S), NAME)
            return
        self._held[item.key] = item
        job = asyncio.create_task(self._fail_unrunnable(item, refused.reason))
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)

    async def _skip(self, msg: Any, why: str) -> None:
        """Not work (refused by the shared rule, or nothing to run): never redeliver it."""
        self.report.skipped += 1
        log.warning("launcher: skipped delivery on %s: %s", msg.subject, why)
        await settle(msg, TERM, NAME)

    async def _not_due(self, item: WorkItem, wait: float) -> bool:
        if wait <= 0:
            return False
        await self._defer(item, wait)
        return True

    async def _defer(self, item: WorkItem, wait: float) -> None:
        """A retry that is not due yet: the server hands it back when it is, to whichever pilot
        fetches then. The wait is kept by the consumer (a nak with that delay), not by this
        pilot, so it survives this pilot, the site agent and the controller stopping."""
        self.report.deferred += 1
        if wait <= self._idle_ttl_s:
            # Work that falls due within our idle TTL: idleness counts from then, not from now.
            self._idle_from = max(self._idle_from, time.monotonic() + wait)
        # Capped: a due time beyond any backoff (a skewed clock) is looked at again later.
        await settle(item.msg, Nak(min(wait, MAX_BACKOFF_S)), NAME)

    async def _redelivered(self, item: WorkItem, held: WorkItem) -> None:
        """A second runnable delivery of a job we hold: never a second allocation."""
        self.report.duplicates += 1
        match decide.redelivery(item.seq, held.seq):
            case Redelivery.LEASING:
                log.info("launcher: job %s redelivered while being leased", item.job_id)
            case Redelivery.STALE:
                log.info("launcher: job %s: stale delivery (seq %d, holding seq %d) skipped",
                         item.job_id, item.seq, held.seq)  # fmt: skip
                await settle(item.msg, ACK, NAME)
            case Redelivery.NEWER:
                log.info("launcher: job %s runnable again at seq %d while held from seq %d; "
                         "retried once released", item.job_id, item.seq, held.seq)  # fmt: skip
                await settle(item.msg, Nak(NAK_DELAY_S), NAME)

    # --- one job --------------------------------------------------------------------------

    async def _run_job(self, item: WorkItem, allocation: Allocation) -> None:
        try:
            leased_at = await self._lease(item, allocation) if await self._submitted(item) else None
            if leased_at is not None:
                await self._run_leased(item, allocation, leased_at)
        except Exception:  # one job's surprise must not leak its allocation or stop the pilot
            log.exception("launcher: job %s failed unexpectedly", item.job_id)
        finally:
            await self._free(item, allocation)
            self._chains.pop(item.key, None)
            self._held.pop(item.key, None)

    async def _free(self, item: WorkItem, allocation: Allocation) -> None:
        """Give the job's slot back (once): when its task has ended, not when its result has
        been appended, so that the next job runs while the log takes the result."""
        if item.key not in self._placed:
            return
        self._placed.discard(item.key)
        if self._diffusion is not None:
            await self._diffusion.release(item, allocation)
        self._packer.release(str(item.job_id))
        self._freed.set()

    async def _fail_unrunnable(self, item: WorkItem, why: str) -> None:
        """Lease a job no pilot of the site can run, only to record why on its history."""
        nowhere = Allocation(str(item.job_id), ())  # the lease holds no node
        try:
            if await self._submitted(item) and await self._lease(item, nowhere) is not None:
                await self._report(item, decide.unrunnable(item, why))
        except Exception:
            log.exception("launcher: job %s failed unexpectedly", item.job_id)
        finally:
            self._chains.pop(item.key, None)
            self._held.pop(item.key, None)

    async def _run_leased(self, item: WorkItem, allocation: Allocation, leased_at: float) -> None:
        cached = None
        if self._diffusion is not None:  # ours now: its workdir may be touched
            cached = await self._diffusion.provide(item, allocation)
            count(self.report, cached)
        tracked = await self._start(item, allocation)
        if isinstance(tracked, str):
            await self._report(item, decide.start_failure(item, tracked))
            return
        match decide.after_start(lost=self.session.lost or self._revoked, draining=self._draining):
            case AfterStart.KILL:  # fenced: the job is someone else's now
                self._chains.pop(item.key, None)
                tracked.task.kill()
                self.report.fenced += 1
            case AfterStart.STOP:  # came up after we started draining: must not run
                tracked.task.terminate(grace_s=2.0)
                await self._report(item, decide.late_start(item, self.session.id))
            case AfterStart.RUN:
                code = await tracked.done
                ended_at = time.monotonic()
                await self._free(item, allocation)  # the result is appended on the job's chain
                # (Not a task we stopped ourselves, which has no chain left to report on.)
                if item.key in self._chains and await self._ended_by_stop(code, ended_at):
                    outcome = decide.ended_with_pilot(
                        item, self.session.id, code, batch=self._batch,
                        remaining_s=self.session.remaining_min() * 60,
                    )  # fmt: skip
                    await self._report(item, outcome)
                    return
                app = self._app_models.get(item.spec.app)
                end = run_end(item, tracked, code, self._data_dir, leased_at=leased_at,
                              python_app=app is not None and app.python)  # fmt: skip
                end = replace(end, cache=cached)
                await self._report(item, decide.run_result(item, end, app))

    async def _submitted(self, item: WorkItem) -> bool:
        """Run only what a user submitted, as it was submitted (:func:`decide.not_as_submitted`)."""
        if item.submitted:  # the delivery is the job.created: nothing to read back
            return True
        try:
            created = await created_spec(self._js, self._site, item.job_id)
        except NotWork as exc:  # what the log holds fails the shared rule
            why: str | None = str(exc)
        except Exception as exc:  # NATS away: someone (maybe we) will try again
            log.warning("launcher: cannot check job %s yet: %s", item.job_id, exc)
            await settle(item.msg, Nak(NAK_DELAY_S), NAME)
            return False
        else:
            why = decide.not_as_submitted(created, item.spec)
        if why is None:
            return True
        if created is None and _deliveries(item.msg) < MISSING_CREATED_DELIVERIES:
            # A direct get may be answered by a replica that has not yet stored the job's
            # job.created (one that was cut off, catching up): ask again before refusing.
            log.warning("launcher: job %s: no job.created on the log yet; asking again",
                        item.job_id)  # fmt: skip
            await settle(item.msg, Nak(MISSING_CREATED_NAK_DELAY_S), NAME)
            return False
        await self._skip(item.msg, f"job {item.job_id}: {why}")
        return False

    async def _lease(self, item: WorkItem, allocation: Allocation) -> float | None:
        """Take the lease; when it was acknowledged (``time.time()``), or None if not taken."""
        started = JobStarted.create(
            site=self._site,
            aggregate_id=item.job_id,
            actor=self.session.actor,
            data=decide.lease(item, self.session.id, allocation),
        )
        try:
            seq = await self._append(started, item.seq)
        except ConflictError:
            self.report.lost_races += 1  # another pilot, or the job moved on (killed, …)
            await settle(item.msg, ACK, NAME)
            return None
        except Exception:
            log.exception("launcher: could not lease job %s", item.job_id)
            seq = None
        if seq is None:  # another pilot may take it; if ours had landed, CAS refuses theirs
            await settle(item.msg, Nak(NAK_DELAY_S), NAME)
            return None
        leased_at = time.time()  # the run's profile: a capture, not another await
        await settle(item.msg, ACK, NAME)
        self._chains[item.key] = seq
        self.report.started += 1
        return leased_at

    async def _start(self, item: WorkItem, allocation: Allocation) -> Tracked | str:
        """Start the task; on failure return the reason (it becomes the job's error).

        Creating the workdir and fork/exec of the job take milliseconds on a busy
        filesystem; both run in a worker thread so that spawns overlap and the event loop
        keeps leasing and reporting meanwhile. A workdir that cannot be made fails the start
        like a task that cannot be executed: the error names it.
        """
        spawning_at = time.time()
        app = self._apps.get(item.spec.app)
        start = job_start(item, allocation, app, data_dir=self._data_dir,
                          base_env=self._base_env)  # fmt: skip
        if isinstance(start, str):
            return start
        spec, call = start
        if call is not None and self._warm is not None and self._warm.runs(app):
            try:  # a frame to a forked worker: no thread, no exec
                task: RunningTask = await self._warm.start(spec, call)
            except StartFailed as exc:
                return str(exc)
            return self._reaper.track(task, spawning_at=spawning_at)
        try:
            task, started_at = await asyncio.to_thread(_spawn, self._app_launcher, spec)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return self._reaper.track(task, spawning_at=spawning_at, started_at=started_at)

    async def _report(self, item: WorkItem, outcome: Outcome) -> None:
        """Append the job's run result on our chain; each job gets at most one result."""
        expect = self._chains.pop(item.key, None)
        if expect is None:
            return  # already reported (drained) or killed as fenced
        event = outcome.kind.create(site=self._site, aggregate_id=item.job_id,
                                    actor=self.session.actor, data=outcome.data)  # fmt: skip
        try:
            until = self._drain_until if self._draining else self.session.deadline
            seq = await append_or_keep(
                self._log, self._outbox, event, expect, until=until,
                gone=lambda: self.session.lost or self._revoked,
            )  # fmt: skip
        except ConflictError:
            self.report.fenced += 1
            log.warning("launcher: fenced on job %s (lease expired); result dropped", item.job_id)
            self.session.suspect()  # was it the whole session? the next beat asks
            return
        except Exception:
            log.exception("launcher: could not report job %s", item.job_id)
            return
        if seq is None:
            log.error("launcher: result of job %s never acknowledged; its lease will expire",
                      item.job_id)  # fmt: skip
            return
        if seq == KEPT:  # the hub decides when it hears of it (agents/site/forward.py)
            self.report.kept += 1
            return
        self.report.count(outcome.tally)

    async def _append(self, event: Event, expect: int) -> int | None:
        until = self._drain_until if self._draining else self.session.deadline
        return await append_patiently(
            self._log, event, expect, until=until, gone=lambda: self.session.lost or self._revoked
        )

    # --- stopping -------------------------------------------------------------------------

    async def _note_stop(self, stop: asyncio.Event, done: asyncio.Event) -> None:
        """Note when the pilot is told to stop (its SIGTERM), for :meth:`_ended_by_stop`."""
        told = asyncio.create_task(stop.wait())
        over = asyncio.create_task(done.wait())
        try:
            await asyncio.wait((told, over), return_when=asyncio.FIRST_COMPLETED)
        finally:
            told.cancel()
            over.cancel()
        if stop.is_set():
            self._stopped_at = time.monotonic()
            self._stopping.set()

    async def _ended_by_stop(self, code: int, ended_at: float) -> bool:
        """Whether a task that ended with ``code`` died of its pilot being stopped.

        The scheduler signals the task and the pilot at once (``scancel``, preemption, its
        time limit), and the task may die first: one that a signal ended waits a moment for
        the pilot's own signal before it is taken for a failure (:data:`decide.STOP_WINDOW_S`).
        """
        if code != 0 and self._stopped_at is None and decide.signalled(code):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), decide.STOP_WINDOW_S)
        return decide.ended_by_stop(code, ended_at=ended_at, stopped_at=self._stopped_at)

    def _stop_task(self, key: JobKey, reason: str) -> bool:
        """Terminate the task of ``key`` and forget its chain; False if it does not run here."""
        for tracked in self._reaper.running():
            if tracked.task.job_id == str(key[1]):
                self._chains.pop(key, None)
                log.warning("launcher: stopping job %s: %s", key[1], reason)
                tracked.task.terminate(grace_s=2.0)
                return True
        return False

    async def _drain(self, reason: ExitReason) -> None:
        """Kill what still runs and record it as RUN_TIMEOUT, chained on our lease."""
        self._draining = True
        # A drain has a TTL to report: after that the lease expires and the controller does it.
        self._drain_until = time.monotonic() + self.session.ttl_s
        # Take the chains first, so a task that dies of our SIGTERM is not reported as an error.
        draining = [
            (tracked, item, self._chains.pop(key))
            for tracked in self._reaper.running()
            if (key := self._key_of(tracked)) in self._chains
            and (item := self._held.get(key)) is not None
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
            item, self.session.id, reason, tracked.task.returncode, batch=self._batch,
            remaining_s=self.session.remaining_min() * 60,
        )  # fmt: skip
        self._chains[item.key] = expect
        await self._report(item, outcome)

    def _kill_all(self, reason: str) -> None:
        """Our session expired: the controller has fenced these jobs; stop them, report nothing."""
        for tracked in self._reaper.running():
            log.warning("launcher: killing job %s: %s", tracked.task.job_id, reason)
            self._chains.pop(self._key_of(tracked), None)
            tracked.task.kill()
            self.report.fenced += 1

    def _key_of(self, tracked: Tracked) -> JobKey:
        return (self._site, uuid.UUID(tracked.task.job_id))


def _spawn(app_launcher: AppLauncher, spec: TaskSpec) -> tuple[RunningTask, float]:
    """Make the task's workdir and start the task (in a worker thread); say when its start
    returned, before the hop back to the event loop: that is when the process was started."""
    make_workdir(spec)
    task = app_launcher.start(spec)
    return task, time.time()


def _fetch_wait_s() -> float:
    return random.uniform(*FETCH_WAIT_S)  # noqa: S311 - jitter, not a secret


def _first_time(seen: set[JobKey], key: JobKey) -> bool:
    """Whether ``key`` is new to ``seen`` (which then holds it); bounded, so a long-lived
    pilot forgets old jobs and may log one of them a second time."""
    if key in seen:
        return False
    if len(seen) >= REFUSALS_REMEMBERED:
        seen.clear()
    seen.add(key)
    return True


def _deliveries(msg: Any) -> int:
    """How many times JetStream has delivered ``msg`` (1 the first time)."""
    try:
        return int(msg.metadata.num_delivered)
    except (AttributeError, TypeError, ValueError):  # not a JetStream delivery
        return 1
