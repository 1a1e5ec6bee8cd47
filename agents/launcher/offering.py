"""The offer of one delivery of ``launch-<site>``: take the job it carries, or say why not.

Every delivery is checked with the shared rule before the pilot acts on it
(:func:`lodestream.agents.launcher.work.work_item`); what fails it is terminated, logged
and counted. What passes is, in this order:

- a second delivery of a job the pilot holds: never a second allocation (:meth:`_redelivered`);
- outside the pilot's tag filter: handed back, unleased, for a pilot whose filter it matches
  (:func:`~lodestream.agents.launcher.decide.outside_filter`), and counted;
- a retry not due yet: handed back with the wait left (:meth:`_defer`);
- not for this pilot (:func:`~lodestream.agents.launcher.decide.refusal`): left to another,
  or failed if no pilot of the site can run it;
- its inputs in a live peer's caches: left to that pilot (data-aware dispatch);
- placed on our nodes and handed to :class:`~lodestream.agents.launcher.running.Running`,
  or handed back until nodes free up.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from datetime import UTC, datetime
from typing import Any, Final

from lodestream.agents.launcher import decide
from lodestream.agents.launcher.config import PilotConfig
from lodestream.agents.launcher.consumer import NAK_DELAY_S, NAME, skip
from lodestream.agents.launcher.decide import Offer, Redelivery, Refusal
from lodestream.agents.launcher.diffusion import Diffusion
from lodestream.agents.launcher.refusals import note_refusal
from lodestream.agents.launcher.running import Running
from lodestream.agents.launcher.session import LauncherSession
from lodestream.agents.launcher.state import PilotState, Waiting
from lodestream.agents.launcher.tags import describe
from lodestream.agents.launcher.work import JobKey, NotRunnable, NotWork, WorkItem, work_item
from lodestream.eventlog import EventLog
from lodestream.eventlog.kernel import ACK, Nak, settle
from lodestream.platform_adapters.errors import ResourceError
from lodestream.platform_adapters.packing import Allocation, JobRequest
from lodestream.schemas.retry import MAX_BACKOFF_S

log = logging.getLogger(__name__)
# A job this pilot can never run: a pilot that can gets it back within this; meanwhile the
# site's pilots do not hand it round twice a second.
REFUSED_NAK_DELAY_S: Final = 5.0
# A kept delivery is handed back after this long without a free slot: well within the feed's
# ack wait (no redelivery to another pilot meanwhile), and short enough that a pilot with
# room elsewhere is not kept waiting for jobs that run long here.
WAIT_MAX_S: Final = 2.0
REFUSALS_REMEMBERED: Final = 10_000  # jobs whose refusal (or hand-back) was logged, once each


class Offering:
    def __init__(
        self,
        pilot: PilotConfig,
        session: LauncherSession,
        state: PilotState,
        running: Running,
        *,
        event_log: EventLog,
        diffusion: Diffusion | None,
    ) -> None:
        self._pilot = pilot
        self._session = session
        self._state = state
        self._running = running
        self._log = event_log
        self._diffusion = diffusion  # node caches and data-aware dispatch; None: off
        self._refusals_logged: set[JobKey] = set()
        self._hand_backs_logged: set[JobKey] = set()

    async def offer(self, msg: Any) -> None:
        """Settle ``msg``, or hold it and hand its job to the run (which settles it)."""
        work = await self._work(msg)
        if work is None:
            return
        item, request = work
        state, pilot = self._state, self._pilot
        held = state.held.get(item.key)
        if held is not None:
            await self._redelivered(item, held)
            return
        wait = item.wait_s(datetime.now(UTC))
        # The filter before the retry's wait: that is for the pilot that takes it.
        if await self._outside_filter(item, msg, wait) or await self._not_due(item, wait):
            return
        refused = decide.refusal(request, mode=pilot.mode, pilot_nodes=len(pilot.nodes),
                                 never_fits=state.packer.can_ever_fit(request),
                                 site=pilot.site_shape, mpi_broken=pilot.mpi_broken)  # fmt: skip
        placing = decide.offer(item.spec, refused=refused,
                               remaining_min=self._session.remaining_min())  # fmt: skip
        if refused is not None:  # NEVER_FITS here, or NOWHERE at this site
            await self._refuse(item, refused)
            return
        prefer = await self._cache_preference(item, msg) if placing is Offer.PLACE else []
        if prefer is None:  # a peer's caches hold its inputs: that pilot's to take
            return
        allocation = state.packer.allocate(request, prefer) if placing is Offer.PLACE else None
        if allocation is not None:
            self._place(item, allocation)
        elif placing is Offer.PLACE and len(state.waiting) < pilot.prefetch:
            # Ours once a slot frees: kept, not handed back and fetched again; its check
            # against the log begins now, not once a slot frees.
            check = None if item.submitted else asyncio.create_task(self._running.check_kept(item))
            state.waiting[item.key] = Waiting(item, request, prefer, time.monotonic(), check)
            state.held[item.key] = item
        else:
            await settle(msg, Nak(NAK_DELAY_S), NAME)  # elsewhere, or here once nodes free

    def _place(
        self, item: WorkItem, allocation: Allocation, check: asyncio.Task[bool] | None = None
    ) -> None:
        state = self._state
        state.held[item.key] = item
        state.placed.add(item.key)
        state.start_job(self._running.run_job(item, allocation, check))

    async def start_waiting(self) -> None:
        """Place the kept deliveries that fit now, in the order they came; hand back those
        kept longer than :data:`WAIT_MAX_S` (another pilot may have room for them).

        Called by the lease loop and the moment a slot frees, maybe both at once: each
        kept delivery is taken out of ``waiting`` before anything is awaited for it.
        """
        state = self._state
        now = time.monotonic()
        for key in list(state.waiting):
            waiting = state.waiting.get(key)
            if waiting is None:  # placed or given back meanwhile
                continue
            if now - waiting.since > WAIT_MAX_S:
                del state.waiting[key]
                await self._give_back(key, waiting)
                continue
            allocation = state.packer.allocate(waiting.request, waiting.prefer)
            if allocation is not None:
                del state.waiting[key]
                self._place(waiting.item, allocation, waiting.check)

    async def give_back_waiting(self) -> None:
        """Stopping: the kept deliveries go back to the feed at once (nothing leased them)."""
        kept = list(self._state.waiting.items())
        self._state.waiting.clear()  # first: a slot freeing meanwhile places none of them
        for key, waiting in kept:
            await self._give_back(key, waiting)

    async def _give_back(self, key: JobKey, waiting: Waiting) -> None:
        """Hand back a delivery already taken out of ``waiting``."""
        if waiting.check is not None:  # it must not settle a delivery handed back
            waiting.check.cancel()
        self._state.held.pop(key, None)
        self._state.report.returned += 1
        await settle(waiting.item.msg, Nak(), NAME)

    async def _work(self, msg: Any) -> tuple[WorkItem, JobRequest] | None:
        """The work ``msg`` carries, or None once a delivery that carries none is settled."""
        try:
            item = work_item(msg, self._pilot.site)
            return item, JobRequest.from_resources(str(item.job_id), item.spec)
        except NotRunnable:  # the controller moves it on; its runnable event comes later
            self._state.report.not_runnable += 1
            await settle(msg, ACK, NAME)
        except (NotWork, ResourceError) as exc:
            await skip(msg, str(exc), self._state.report)
        return None

    async def _outside_filter(self, item: WorkItem, msg: Any, wait: float) -> bool:
        """Hand the job back if it is outside this pilot's tag filter; True if handed back."""
        if not self._pilot.filter_tags:
            return False
        back = decide.outside_filter(
            item.spec.tags, self._pilot.filter_tags, idle_ttl_s=self._pilot.idle_ttl_s,
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
            self._state.report.cache_deferred += 1
            await settle(msg, Nak(delay), NAME)
            return None
        return prefer

    async def _hand_back(self, item: WorkItem, back: decide.HandBack) -> None:
        """Outside our tag filter: another pilot's to take. Never leased here, so it holds
        no allocation and nothing waits on it; the consumer offers it again after the delay."""
        self._state.report.filtered += 1
        if _first_time(self._hand_backs_logged, item.key):
            log.info("launcher: job %s is left to other pilots: %s (this pilot's filter: %s)",
                     item.job_id, back.reason, describe(self._pilot.filter_tags))  # fmt: skip
        await settle(item.msg, Nak(back.delay_s), NAME)

    async def _refuse(self, item: WorkItem, refused: Refusal) -> None:
        """Not for this pilot: leave it to another (nak), or fail it if no pilot can run it."""
        if _first_time(self._refusals_logged, item.key):  # once per job, not per redelivery
            self._state.report.refused += 1
            log.warning("launcher: job %s is not for this pilot: %s", item.job_id, refused.reason)
        if not refused.nowhere:
            # On record once per runnable event (refusals.py): the job's history says why.
            noted = not item.refused and await note_refusal(
                self._log, item, session_id=self._session.id, actor=self._session.actor,
                reason=refused.reason,
            )  # fmt: skip
            await settle(item.msg, ACK if noted else Nak(REFUSED_NAK_DELAY_S), NAME)
            return
        self._state.held[item.key] = item
        self._state.start_job(self._running.fail_unrunnable(item, refused.reason))

    async def _not_due(self, item: WorkItem, wait: float) -> bool:
        if wait <= 0:
            return False
        await self._defer(item, wait)
        return True

    async def _defer(self, item: WorkItem, wait: float) -> None:
        """A retry that is not due yet: the server hands it back when it is, to whichever pilot
        fetches then. The wait is kept by the consumer (a nak with that delay), not by this
        pilot, so it survives this pilot, the site agent and the controller stopping."""
        state = self._state
        state.report.deferred += 1
        if wait <= self._pilot.idle_ttl_s:
            # Work that falls due within our idle TTL: idleness counts from then, not from now.
            state.idle_from = max(state.idle_from, time.monotonic() + wait)
        # Capped: a due time beyond any backoff (a skewed clock) is looked at again later.
        await settle(item.msg, Nak(min(wait, MAX_BACKOFF_S)), NAME)

    async def _redelivered(self, item: WorkItem, held: WorkItem) -> None:
        """A second runnable delivery of a job we hold: never a second allocation."""
        self._state.report.duplicates += 1
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


def _first_time(seen: set[JobKey], key: JobKey) -> bool:
    """Whether ``key`` is new to ``seen`` (which then holds it); bounded, so a long-lived
    pilot forgets old jobs and may log one of them a second time."""
    if key in seen:
        return False
    if len(seen) >= REFUSALS_REMEMBERED:
        seen.clear()
    seen.add(key)
    return True
