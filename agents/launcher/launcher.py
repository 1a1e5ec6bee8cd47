"""The pilot: lease runnable work for its site, pack it on its nodes, run it, report it.

One job's way through the pilot, file by file:

1. :class:`Launcher` (here) opens the session, beats, and fetches from ``launch-<site>``
   while its nodes have room;
2. :class:`~lodestream.agents.launcher.offering.Offering` decodes each delivery and takes its
   job (places it on our nodes), or hands it back, defers, refuses or skips it;
3. :class:`~lodestream.agents.launcher.running.Running` leases the job (``job.started``
   chained on its runnable event), starts its task, waits for it and appends the result on
   the same chain;
4. :class:`~lodestream.agents.launcher.stopping.Stopping` stops a killed task, and, when the
   pilot ends, drains what still runs (or kills it, its session or credential gone).

What they share (the jobs held, their chains, the nodes' slots, the report) is one
:class:`~lodestream.agents.launcher.state.PilotState`; what the pilot is and what it runs jobs
with are :class:`~lodestream.agents.launcher.config.PilotConfig` and
:class:`~lodestream.agents.launcher.config.PilotParts`.

A successful run that nothing follows (no ``postprocess`` hook, no stage-out)
is reported as ``job.finished`` standing for ``job.run_done`` too, with the
run's result in it: one event fewer per job on the common path.
If the result's append conflicts, the controller expired
the lease in between (the pilot was paused or cut off) — the pilot was
fenced, and its task is killed at once.

A NATS outage is not a verdict. Tasks keep running while the client
reconnects; appends that got no answer are retried with the same event id
until they land or are refused; the pilot leases nothing while its heartbeat
is unacknowledged for longer than the TTL. Only when the controller has
expired the session (``session.lost``) does the pilot kill everything it runs:
its jobs belong to someone else now.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import time
from collections.abc import Awaitable
from typing import Any, Final

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from lodestream.agents.launcher.config import PilotConfig, PilotParts
from lodestream.agents.launcher.consumer import NAK_DELAY_S, NAME
from lodestream.agents.launcher.errors import ExpiredBeforeOpened
from lodestream.agents.launcher.offering import Offering
from lodestream.agents.launcher.report import ExitReason, LauncherReport
from lodestream.agents.launcher.running import Running
from lodestream.agents.launcher.session import LauncherSession
from lodestream.agents.launcher.state import PilotState
from lodestream.agents.launcher.stopping import Stopping
from lodestream.agents.launcher.watch import JobWatch
from lodestream.agents.site.retry import retry_until, stopped_within
from lodestream.eventlog import ConflictError, EventLog
from lodestream.eventlog.kernel import deliveries
from lodestream.eventlog.pull import PullLoop, pull_consumer
from lodestream.eventlog.transient import transient
from lodestream.platform_adapters.packing import NodePacker
from lodestream.schemas.resources import NodeInfo
from lodestream.schemas.topology import KILLS, LAUNCH, PEERS

__all__ = ["Launcher", "LauncherReport"]

log = logging.getLogger(__name__)
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
        self._nc = nc
        self.session = session
        self._pilot = pilot
        self._parts = parts
        self._state = PilotState(NodePacker(pilot.nodes))
        event_log = EventLog(js)
        running = Running(js, session, pilot, parts, self._state, event_log=event_log)
        self._stopping = Stopping(pilot, session, self._state, running)
        self._offering = offering = Offering(
            pilot, session, self._state, running, event_log=event_log, diffusion=parts.diffusion
        )
        self._state.place_waiting = offering.start_waiting
        # The offer settles or holds each delivery itself; the kernel hands back one that
        # met NATS away, and logs (and leaves for redelivery) one that met a bug.
        self._each_delivery = deliveries(offering.offer, NAME, retry_s=NAK_DELAY_S)
        self._watch = JobWatch(js, pilot.site, chains=self._state.chains,
                               stop_task=self._stopping.stop_task,
                               report=self._state.report)  # fmt: skip

    # --- lifecycle ------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> LauncherReport:
        warm = self._parts.warm
        if warm is not None and any(warm.runs(app) for app in self._parts.apps.values()):
            warm.ensure_open()  # ready by the first function job
        try:
            return await self._run_opened(stop)
        finally:
            if warm is not None:
                await warm.opened()
                warm.close()

    async def _run_opened(self, stop: asyncio.Event) -> LauncherReport:
        state, report, stopping = self._state, self._state.report, self._stopping
        unopened = await self._open(stop)
        if unopened is not None:
            report.exit_reason = unopened
            return report
        reaper_stop = asyncio.Event()
        beat_stop = asyncio.Event()
        background = [
            asyncio.create_task(state.reaper.run(reaper_stop)),
            asyncio.create_task(self.session.heartbeat_forever(self._stats, beat_stop)),
            asyncio.create_task(self._watch.check_forever(self.session.ttl_s, beat_stop)),
            asyncio.create_task(stopping.note_stop(stop, beat_stop)),
        ]
        kills = await self._subscribe_live()
        try:
            report.exit_reason = await self._lease_loop(stop)
        finally:
            await self._offering.give_back_waiting()  # kept, never leased: another's to take
            if self.session.lost:
                stopping.kill_all("session lost: the controller expired it")
            elif state.revoked:
                report.exit_reason = ExitReason.REVOKED
                stopping.kill_all("the site's credential was revoked: nothing can be reported")
            else:
                await stopping.drain(report.exit_reason)
            if state.jobs:
                await asyncio.gather(*state.jobs, return_exceptions=True)
            for kill_sub in kills:
                with contextlib.suppress(nats.errors.Error):
                    await kill_sub.unsubscribe()
            reaper_stop.set()
            beat_stop.set()
            await asyncio.gather(*background, self._watch.settled(), return_exceptions=True)
            if not self.session.lost and not state.revoked:
                await self.session.close(report.exit_reason)
            diffusion = self._parts.diffusion
            if diffusion is not None:  # node-local disks are the next batch job's
                await asyncio.to_thread(diffusion.cache.close)
        return report

    async def _subscribe_live(self) -> list[Any]:
        """The live feeds: kills, and (with caches) what the site's other pilots cache."""
        subs = []
        site, diffusion = self._pilot.site, self._parts.diffusion
        if self._nc is not None:
            for subject in KILLS.filter_subjects(site):
                subs.append(await self._nc.subscribe(subject, cb=self._watch.on_killed))
            if diffusion is not None:
                self.session.cached = diffusion.cache.digest
                peers = diffusion.peers
                for subject in PEERS.filter_subjects(site):
                    subs.append(await self._nc.subscribe(subject, cb=peers.on_message))
        return subs

    async def _open(self, stop: asyncio.Event) -> ExitReason | None:
        """Open the session, retrying (logged, with backoff); else why it was not opened."""
        nodes = [NodeInfo(hostname=n.hostname, cores=max(len(n.cpu_ids), 1), gpus=len(n.gpu_ids))
                 for n in self._pilot.nodes]  # fmt: skip

        async def attempt() -> bool:
            await self.session.open(socket.gethostname(), self._pilot.mode, nodes)
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
        self._state.revoked = True

    async def _lease_loop(self, stop: asyncio.Event) -> ExitReason:
        # Topped up: the launch feed also carries the creation of jobs not created runnable,
        # which take up a pilot's request without filling its slots (eventlog/pull.py).
        sub = await pull_consumer(self._js, LAUNCH.stream, LAUNCH.durable(self._pilot.site),
                                  top_up=True)  # fmt: skip
        pulling = PullLoop(sub, name="launcher", batch=self._fetch_size, timeout_s=_fetch_wait_s)
        state, idle_ttl_s = self._state, self._pilot.idle_ttl_s
        idle_since = time.monotonic()
        try:
            while not stop.is_set():
                if self.session.lost:
                    return ExitReason.SESSION_LOST
                if self.session.remaining_min() <= 0:
                    return ExitReason.WALL_TIME
                if state.jobs:
                    idle_since = time.monotonic()
                elif time.monotonic() - max(idle_since, state.idle_from) > idle_ttl_s:
                    return ExitReason.IDLE
                if self.session.lapsed:
                    # Unacknowledged heartbeats for a TTL: lease nothing until we know whether
                    # the controller expired us. Running tasks go on meanwhile.
                    await stopped_within(stop, LAPSED_POLL_S)
                    continue
                await self._offering.start_waiting()
                full = state.packer.idle_node_count == 0 and not self._has_free_cpu()
                # Full: wait for a slot to free, unless there is room to keep deliveries for
                # it (launcher.prefetch) and none is kept yet.
                if full and (state.waiting or not self._pilot.prefetch):
                    state.freed.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(state.freed.wait(), 0.5)
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
        # fetching more than that, and than the deliveries it may keep for the next free
        # slots, would hand the surplus back (nak) and delay it.
        state, pilot = self._state, self._pilot
        free = sum(max(len(n.cpu_ids), 1) for n in pilot.nodes) - len(state.placed)
        keep = pilot.prefetch - len(state.waiting)
        return max(1, min(pilot.max_fetch, max(free, 0) + max(keep, 0)))

    def _has_free_cpu(self) -> bool:
        return any(node.fits(1, 0, 0.0) for node in self._state.packer.nodes)

    def _stats(self) -> tuple[int, int, int]:
        free = sum(n.idle_cpu_count for n in self._state.packer.nodes)
        return len(self._state.reaper), len(self._state.jobs), free


def _fetch_wait_s() -> float:
    return random.uniform(*FETCH_WAIT_S)  # noqa: S311 - jitter, not a secret
