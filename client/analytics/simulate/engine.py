"""The discrete-event simulation: jobs arrive, wait for their parents, become runnable, wait
in their site's queue, take slots on pilots, (read from shared storage,) compute; a failed
attempt is requeued after its retry's wait and runs again; the last one's result ends the
job, and its end may make its children runnable. One ``heapq`` of events.

How the pilots are modelled, and why:

* A site's runnable jobs wait in the order their pilots leased them in the recording (the
  ``launch-<site>`` consumer's delivery and the pilots' fetches decide it, not the order
  of becoming runnable: replaying that order is what gives the recording back), else in
  the order they became runnable (kept as one queue per job width). The queue's first job
  goes to the pilot whose fetch is next in turn, among those that fetch (a slot free, or
  room to keep one more delivery: launcher.prefetch); that pilot starts it if it fits
  there, else keeps it for its own next room (at most :data:`KEEP_S`: another pilot's
  free slot is not its), else hands it back (nak), as a pilot does with what it fetched
  and cannot place: it leaves the queue, so a node that frees up meanwhile goes to the
  next job, and is offered again after the hand-back delay (in the phase its cycle had in
  the recording, when it was handed back there too). With no pilot fetching, the job
  keeps its place.
* A job of one node takes its ``units`` slots of one node of an open pilot (a slot is a
  core; a job that may share its node with one other takes half of it); a job of ``n > 1``
  nodes takes ``n`` whole idle nodes of one pilot (an MPI job).
* An attempt holds its slot from the moment it is dispatched for its recorded dispatch
  delay (from the offer it was leased at, if it was handed back), the pilot's overhead,
  its I/O, then its compute. A job ends ``finish_s`` after its last attempt's result; a
  child is runnable ``prepare_s`` after its last parent's end.
* Pilots stay for the whole run (wall time is not modelled).

With ``strategy`` set, every job is routed when it is submitted, among the sites whose
pilots can hold it, by the API's own strategy functions
(:func:`lodestream.services.api.placement.choose` over :func:`site_figures`, with each
site's capacity as the API would read it: its open pilots' slots, the median of its last
runs of the app, the jobs routed there and not done).
"""

from __future__ import annotations

import bisect
import heapq
import math
import statistics
from collections import deque
from dataclasses import dataclass, field, replace

from lodestream.client.analytics.simulate.calibrate import Calibration
from lodestream.client.analytics.simulate.errors import BadScenario
from lodestream.client.analytics.simulate.model import (
    KEEP_S,
    Attempt,
    JobTrace,
    Scenario,
    amdahl_s,
    workload,
)
from lodestream.client.analytics.simulate.pilots import Cycle, Pilot
from lodestream.client.analytics.simulate.storage import SharedStorage
from lodestream.schemas.resources import JobResources
from lodestream.services.api.capacity import (
    RUN_SAMPLE,
    Estimate,
    Node,
    RunTimes,
    SiteCapacity,
    slots,
)
from lodestream.services.api.placement import SiteLoad, choose, site_figures

_ARRIVE, _RUNNABLE, _OPEN, _IO, _DONE, _OFFER, _UNKEEP = range(7)
# A pilot hands back what it kept *longer* than KEEP_S: at a tie with a slot freeing (a job
# kept behind one of exactly that length), the slot wins. Such events sort after the others.
_LAST = 1 << 62


@dataclass(frozen=True, slots=True)
class Prediction:
    makespan_s: float  # first submission → last job.finished
    jobs: int
    mean_wait_s: float  # runnable → a slot
    per_site: dict[str, int]
    handed_back: int = 0  # offers of a job that did not fit while a slot was free

    @property
    def throughput_per_s(self) -> float:
        return self.jobs / self.makespan_s if self.makespan_s > 0 else 0.0


@dataclass(slots=True)
class _Site:
    # The runnable jobs, one queue (a heap) per width (nodes): (the attempt's recorded lease,
    # else when it became runnable; order of becoming runnable; job).
    queues: dict[tuple[int, int], list[tuple[float, int, int]]] = field(default_factory=dict)
    pilots: list[Pilot] = field(default_factory=list)
    widest: int = 0  # nodes of its widest pilot (open or not)
    storage: SharedStorage | None = None
    load: SiteLoad = field(default_factory=lambda: SiteLoad(0, {}))
    queued: dict[str, int] = field(default_factory=dict)  # app -> routed here, not done
    runs: dict[str, deque[float]] = field(default_factory=dict)  # app -> its last run times
    fit: dict[int, int] = field(default_factory=dict)  # job width -> slots of the open pilots
    medians: dict[str, float] = field(default_factory=dict)  # app -> median of runs
    # Jobs handed back, by width: job -> (its cycle, offers up to when are accounted for).
    # Offered again only once the room has grown enough for them (see _Run._wake).
    parked: dict[tuple[int, int], dict[int, tuple[Cycle, float]]] = field(default_factory=dict)
    # Its open pilots in the order their fetches are served (launcher's pull requests).
    turn: deque[Pilot] = field(default_factory=deque)
    kept: int = 0  # jobs its pilots keep
    busy_since: float | None = None  # since when no open pilot has a slot free
    # While jobs are parked: the spells with no slot free, their starts and their ends.
    spell_starts: list[float] = field(default_factory=list)
    spell_ends: list[float] = field(default_factory=list)

    def any_free(self) -> bool:
        return any(p.free_slots for p in self.pilots)

    def __post_init__(self) -> None:
        self.load.capacity = SiteCapacity(run_s=self.medians)

    def opened(self, pilot: Pilot) -> None:
        self.pilots.append(pilot)
        self.turn.append(pilot)
        self.fit.clear()
        # As the API reads it: a slot of the simulation is one core of a node.
        nodes = tuple(Node(cores=size) for size in pilot.size)
        self.load.capacity = replace(self.load.capacity, pilots=(*self.load.capacity.pilots, nodes))

    def ran(self, app: str, run_s: float) -> None:
        """A run of ``app`` ended here after ``run_s``: the medians move."""
        runs = self.runs.setdefault(app, deque(maxlen=RUN_SAMPLE))
        runs.append(run_s)
        self.medians[app] = statistics.median(runs)  # the capacity's run_s: no copy each run
        every = [r for rs in self.runs.values() for r in rs]
        self.load.capacity = replace(self.load.capacity, any_run_s=statistics.median(every))

    def slots_for(self, width: int) -> int:
        fit = self.fit.get(width)
        if fit is None:
            fit = self.fit[width] = slots(self.load.capacity.pilots, _shape(width))
        return fit


def _shape(width: int) -> JobResources:
    """A job of ``width`` nodes taking one slot (one core) of each."""
    return JobResources(num_nodes=width, node_packing_count=4096)


def simulate(cal: Calibration, scenario: Scenario) -> Prediction:
    """Replay ``cal``'s jobs under ``scenario``; the predicted makespan and throughput."""
    return _Run(cal, scenario).run()


class _Run:
    def __init__(self, cal: Calibration, scenario: Scenario) -> None:
        self.jobs = workload(cal.jobs, scenario)
        n = len(self.jobs)
        self.scenario = scenario
        self.nodes = [scenario.nodes_per_job or job.num_nodes for job in self.jobs]
        self.sites = {site: _Site() for site in cal.pilots}
        self.heap: list[tuple[float, int, int, int]] = []
        self.seq = 0
        self.alloc: dict[int, tuple[Pilot, tuple[tuple[int, int], ...]]] = {}
        self.site_of: list[str] = [job.site for job in self.jobs]
        self.attempt = [0] * n  # the attempt each job is at
        self.pending = [len(job.parents) for job in self.jobs]  # parents not ended
        self.parents_end = [0.0] * n
        self.children: list[list[int]] = [[] for _ in range(n)]
        for i, job in enumerate(self.jobs):
            for parent in job.parents:
                self.children[parent].append(i)
        self.arrived = [scenario.strategy is None] * n  # routed to its site
        self.runnable_at = [0.0] * n
        self.started_at = [0.0] * n
        self.key = [0.0] * n  # its place in its site's queue
        self.hand_back_s = cal.hand_back_s
        self.kept_per_pilot = cal.kept_per_pilot
        self.keeper: dict[int, Pilot] = {}  # job -> the pilot that keeps it
        self.handed_back = 0
        self.run_times = RunTimes()  # each app's median across the sites
        self.waited = 0.0
        self.runs = 0
        self.end = 0.0
        self.opening: list[tuple[str, Pilot]] = []
        bandwidth = self._bandwidth(cal)
        for site, state in self.sites.items():
            shapes = scenario.pilots_of(site, cal.pilots[site])
            state.widest = max(len(s.slots_per_node) for s in shapes)
            state.storage = SharedStorage(bandwidth) if bandwidth is not None else None
            for shape in shapes:
                self.opening.append((site, Pilot(list(shape.slots_per_node),
                                                  list(shape.slots_per_node))))  # fmt: skip
                self._push(shape.opens_at, _OPEN, len(self.opening) - 1)
        self._check_fits()
        for i, job in enumerate(self.jobs):
            if scenario.strategy is not None:
                self._push(job.arrival, _ARRIVE, i)
            elif not self.pending[i]:
                self._ready(i)

    def _ready(self, i: int) -> None:
        """Job ``i`` is at its site and its parents have ended: it becomes runnable
        ``prepare_s`` later (or, with no attempt, ends ``finish_s`` after that)."""
        job = self.jobs[i]
        at = max(job.arrival, self.parents_end[i]) + job.prepare_s
        if job.attempts:
            self._push(at + job.attempts[0].backoff_s, _RUNNABLE, i)
        else:
            self._ended(i, at + job.finish_s)

    def _ended(self, i: int, at: float) -> None:
        self.end = max(self.end, at)
        for child in self.children[i]:
            self.pending[child] -= 1
            self.parents_end[child] = max(self.parents_end[child], at)
            if not self.pending[child] and self.arrived[child]:
                self._ready(child)

    def _bandwidth(self, cal: Calibration) -> float | None:
        if cal.storage is None:
            if self.scenario.bandwidth is not None:
                raise BadScenario("a bandwidth needs an I/O model of the recording: give "
                                  "its I/O fraction and the bandwidth it ran with")  # fmt: skip
            return None
        return self.scenario.bandwidth or cal.storage.bandwidth * (
            self.scenario.bandwidth_factor or 1.0
        )

    def _check_fits(self) -> None:
        widest = max(state.widest for state in self.sites.values())
        for i, nodes in enumerate(self.nodes):
            limit = (
                widest if self.scenario.strategy is not None else self.sites[self.site_of[i]].widest
            )
            if nodes > limit:
                raise BadScenario(f"a job of {nodes} node(s) fits no pilot (the widest has "
                                  f"{limit} node(s))")  # fmt: skip

    def _push(self, at: float, kind: int, index: int, *, last: bool = False) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at, self.seq + _LAST if last else self.seq, kind, index))

    def run(self) -> Prediction:
        heap = self.heap
        storages = [(s, st.storage) for s, st in self.sites.items() if st.storage is not None]
        while heap or any(len(st) for _, st in storages):
            at_heap = heap[0][0] if heap else math.inf
            io_site, io_at = _first_io_end(storages)
            if io_at < at_heap:
                self._io_ended(io_site, io_at)
                continue
            now, _, kind, i = heapq.heappop(heap)
            if kind == _RUNNABLE:
                site = self.sites[self.site_of[i]]
                self.runnable_at[i] = now
                attempt = self.jobs[i].attempts[self.attempt[i]]
                self.key[i] = attempt.order if attempt.order is not None else now
                self._queue(site, i)
                self._dispatch(site, now)
            elif kind == _OFFER:  # back from a hand-back, in its place
                site = self.sites[self.site_of[i]]
                self._queue(site, i)
                while heap and heap[0][0] == now and heap[0][2] == _OFFER:
                    # Handed back together, offered together: the queue orders them.
                    self._queue(self.sites[self.site_of[heap[0][3]]], heap[0][3])
                    heapq.heappop(heap)
                self._dispatch(site, now)
            elif kind == _DONE:
                self._done(i, now)
            elif kind == _UNKEEP:
                self._unkeep(i, now)
            elif kind == _IO:
                storage = self.sites[self.site_of[i]].storage
                assert storage is not None  # an _IO event is pushed only with storage
                storage.add(now, i, self.jobs[i].attempts[self.attempt[i]].io_bytes)
            elif kind == _OPEN:
                name, pilot = self.opening[i]
                self.sites[name].opened(pilot)
                self._wake(self.sites[name], now, 0.0)  # every opening is scheduled first
                self._dispatch(self.sites[name], now)
            else:
                self._route(i, now)
        per_site: dict[str, int] = dict.fromkeys(self.sites, 0)
        for name in self.site_of:
            per_site[name] += 1
        runs = self.runs
        mean_wait = self.waited / runs if runs else 0.0
        return Prediction(self.end, len(self.jobs), mean_wait, per_site, self.handed_back)

    def _route(self, i: int, now: float) -> None:
        job = self.jobs[i]
        figures = {}
        for name, site in self.sites.items():
            if self.nodes[i] > site.widest:
                continue
            capacity = site.load.capacity
            run_s = self.run_times.of(capacity, job.app)
            ahead_s = self.run_times.work_s(capacity, site.queued)
            eta = Estimate.at(site.slots_for(self.nodes[i]), run_s, ahead_s)
            figures[name] = site_figures(site.load, job.app, eta)
        assert self.scenario.strategy is not None
        chosen = choose(self.scenario.strategy, figures).chosen
        routed = self.sites[chosen]
        routed.load.backlog += 1
        routed.load.assigned[job.app] = routed.load.assigned.get(job.app, 0) + 1
        routed.queued[job.app] = routed.queued.get(job.app, 0) + 1
        self.site_of[i] = chosen
        self.arrived[i] = True
        if not self.pending[i]:
            self._ready(i)

    def _queue(self, site: _Site, i: int) -> None:
        width = (self.nodes[i], self.jobs[i].units)
        heapq.heappush(site.queues.setdefault(width, []), (self.key[i], self.seq, i))

    def _dispatch(self, site: _Site, now: float) -> None:
        """Hand the earliest runnable jobs to the pilots that fetch, until none does. A pilot
        fetches while it has a slot free or room to keep one more job; a job goes to the
        pilot whose fetch is next in turn (then last in turn), which starts it if it fits
        there, else keeps it, else hands it back."""
        while True:
            first = None
            for width, queue in site.queues.items():
                if queue and (first is None or queue[0] < first[0]):
                    first = (queue[0], width)
            if first is None:
                return
            pilot = self._fetching(site)
            if pilot is None:
                return
            (_, _, i), width = first
            heapq.heappop(site.queues[width])
            site.turn.remove(pilot)
            site.turn.append(pilot)
            if self._take(site, pilot, i, width, now):
                continue
            if len(pilot.kept) < self.kept_per_pilot:
                pilot.kept[i] = now  # placed the moment room grows on this pilot
                self.keeper[i] = pilot
                site.kept += 1
                self._push(now + KEEP_S, _UNKEEP, i, last=True)
            else:
                self._park(site, i, now)

    def _fetching(self, site: _Site) -> Pilot | None:
        """The pilot whose fetch the next delivery goes to: each open pilot fetches while it
        has a slot free or may keep another delivery (launcher._fetch_size), in turn."""
        for pilot in site.turn:
            if pilot.free_slots or len(pilot.kept) < self.kept_per_pilot:
                return pilot
        return None

    def _park(self, site: _Site, i: int, now: float) -> None:
        self.handed_back += 1
        width = (self.nodes[i], self.jobs[i].units)
        site.parked.setdefault(width, {})[i] = (self._cycle(i, now), now)

    def _wake(self, site: _Site, now: float, since: float) -> None:
        """Room has just grown at ``now`` (a job ended, a pilot opened; its event was
        scheduled at ``since``): the jobs handed back that fit now are offered again at
        their next offer from here.

        Between two growths the room only shrinks, so an offer in between finds a parked job
        too small: it is handed back again while a slot is free, or, with none free, left
        in the queue, to be considered (and handed back, a new cycle) when the spell with no
        slot free ends. Those offers are not simulated one by one, at an event each: a
        parked job is looked at only when its width fits, and its offers since it was
        parked are then replayed over the spells with no slot free (:meth:`_replay`).
        """
        busy = site.busy_since
        site.busy_since = None
        if not site.parked and not site.kept:
            site.spell_starts.clear()
            site.spell_ends.clear()
            return
        if busy is not None:
            site.spell_starts.append(busy)
            site.spell_ends.append(now)
        self._place_kept(site, now)
        for width in [w for w, group in site.parked.items() if group]:
            if not any(pilot.fits(*width) for pilot in site.pilots):
                continue
            for i, (parked_cycle, parked_at) in site.parked.pop(width).items():
                cycle = self._replay(site, i, parked_cycle, parked_at, now)
                if cycle is None:
                    self._queue(site, i)
                else:
                    self._push(self._next_offer(cycle, now, since), _OFFER, i)

    def _place_kept(self, site: _Site, now: float) -> None:
        """Each pilot's kept jobs first, in order, on that pilot, as it places them when a
        slot of its own frees."""
        for pilot in site.pilots:
            for i in list(pilot.kept):
                if self._take(site, pilot, i, (self.nodes[i], self.jobs[i].units), now):
                    del pilot.kept[i]
                    del self.keeper[i]
                    site.kept -= 1

    def _unkeep(self, i: int, now: float) -> None:
        """Job ``i`` has been kept for :data:`KEEP_S` (if it still is): its pilot hands it
        back. Offered at its next offer if another pilot has room for it now, else parked
        until room grows; its pilot may fetch another meanwhile."""
        pilot = self.keeper.get(i)
        if pilot is None or pilot.kept[i] + KEEP_S != now:  # placed, or kept again since
            return
        site = self.sites[self.site_of[i]]
        del pilot.kept[i]
        del self.keeper[i]
        site.kept -= 1
        self._park(site, i, now)
        width = (self.nodes[i], self.jobs[i].units)
        if any(other.fits(*width) for other in site.pilots):
            cycle, _ = site.parked[width].pop(i)
            self._push(cycle.first_after(now), _OFFER, i)
        self._dispatch(site, now)

    def _take(self, site: _Site, pilot: Pilot, i: int, width: tuple[int, int], now: float) -> bool:
        """Start job ``i`` on ``pilot`` if it has room for it; whether it had. A start that
        takes a site's last free slot begins a spell with none free."""
        taken = pilot.take(*width)
        if taken is None:
            return False
        self.alloc[i] = (pilot, taken)
        self._start(i, now)
        if site.busy_since is None and not site.any_free():
            site.busy_since = now
        return True

    def _replay(
        self, site: _Site, i: int, cycle: Cycle, parked_at: float, now: float
    ) -> Cycle | None:
        """Job ``i``'s offers since ``parked_at``, each counted: one while a slot was free is
        a hand-back; one in a spell with no slot free left it queued until the spell's end,
        where it did not fit (else it would have been unparked) and was handed back, a new
        cycle. Its cycle now, or None if an offer in the spell ending ``now`` left it queued.
        An offer due exactly at ``now`` outside such a spell is left to :meth:`_next_offer`.
        """
        starts, ends = site.spell_starts, site.spell_ends
        tie = 1e-9 * cycle.period
        offer = cycle.first_after(parked_at)
        while offer <= now + tie:
            j = bisect.bisect_right(starts, offer) - 1
            if j >= 0 and offer <= ends[j]:  # no slot free: queued until the spell ends
                if ends[j] >= now - tie:
                    return None
                self.handed_back += 1
                cycle = self._cycle(i, ends[j])
                offer = cycle.first_after(ends[j])
                continue
            if offer >= now - tie:
                break
            # A slot free until the next spell: every offer till then is a hand-back.
            later = starts[j + 1] if j + 1 < len(starts) else math.inf
            handed, offer = cycle.offers_until(offer, min(later, now - tie))
            self.handed_back += handed
        return cycle

    @staticmethod
    def _next_offer(cycle: Cycle, now: float, since: float) -> float:
        """The job's first offer to see the room that grows at ``now``. An offer due at
        ``now`` itself sees it if the event that grows it was scheduled first (at ``since``,
        no later than that offer was: the event queue breaks ties in order of scheduling)."""
        at = cycle.first_at_or_after(now)
        if at > now + 1e-9 * cycle.period:
            return at
        scheduled = max(cycle.handed_at, at - cycle.period)
        return at if since <= scheduled else cycle.first_after(now)

    def _cycle(self, i: int, handed_at: float) -> Cycle:
        """The offers of job ``i`` after its hand-back at ``handed_at``: a hand-back delay
        apart, in the phase of the cycle it was leased from in the recording (its phase
        decides whether a node that frees up between two offers is its at the next one or
        another job's before it: that cycle's offer is when it took its node)."""
        phase = self.jobs[i].attempts[self.attempt[i]].offered
        return Cycle(handed_at, self.hand_back_s, handed_at if phase is None else phase)

    def _start(self, i: int, now: float) -> None:
        attempt = self.jobs[i].attempts[self.attempt[i]]
        self.waited += now - self.runnable_at[i]
        self.runs += 1
        self.started_at[i] = now
        ready = now + attempt.dispatch_s + attempt.overhead_s
        if attempt.io_bytes > 0 and self.sites[self.site_of[i]].storage is not None:
            self._push(ready, _IO, i)
        else:
            self._push(ready + self._compute_s(i), _DONE, i)

    def _compute_s(self, i: int) -> float:
        return _compute_s(self.jobs[i], self.jobs[i].attempts[self.attempt[i]], self.scenario)

    def _io_ended(self, name: str, now: float) -> None:
        storage = self.sites[name].storage
        assert storage is not None
        for i in storage.pop_ended(now):
            self._push(now + self._compute_s(i), _DONE, i)

    def _done(self, i: int, now: float) -> None:
        pilot, taken = self.alloc.pop(i)
        job = self.jobs[i]
        site = self.sites[self.site_of[i]]
        pilot.give_back(taken)
        self._wake(site, now, self.started_at[i])
        last = self.attempt[i] + 1 == len(job.attempts)
        if self.scenario.strategy is not None:
            if last:
                site.load.backlog -= 1
                site.queued[job.app] -= 1
            site.ran(job.app, now - self.started_at[i])
            pooled = [r for other in self.sites.values() for r in other.runs.get(job.app, ())]
            self.run_times = RunTimes({**self.run_times.elsewhere,
                                       job.app: statistics.median(pooled)})  # fmt: skip
        if last:
            self._ended(i, now + job.finish_s)
        else:
            self.attempt[i] += 1
            again = job.attempts[self.attempt[i]]
            self._push(now + again.requeue_s + again.backoff_s, _RUNNABLE, i)
        self._dispatch(site, now)


def _first_io_end(storages: list[tuple[str, SharedStorage]]) -> tuple[str, float]:
    first, at = "", math.inf
    for name, storage in storages:
        end = storage.next_end()
        if end is not None and end < at:
            first, at = name, end
    return first, at


def _compute_s(job: JobTrace, attempt: Attempt, scenario: Scenario) -> float:
    """The attempt's compute time on its scenario's nodes (Amdahl, from its recorded nodes)."""
    if scenario.nodes_per_job is None or scenario.nodes_per_job == job.num_nodes:
        return attempt.compute_s
    p = scenario.parallel_fraction
    one_node = attempt.compute_s / ((1.0 - p) + p / job.num_nodes)
    return amdahl_s(one_node, p, scenario.nodes_per_job)
