"""From a recording to the trace the simulator replays: the workload's structure, and
what each step cost.

* **Arrivals**: the recorded submission times, as offsets from the first.
* **Structure**: each job's parents (those in the recording), and its attempts in turn.
* **Stage costs**, per job: *prepare*, from its creation or its last parent's end (whichever
  is later) to its first runnable event (the controller's steps, staging in,
  preprocessing); per attempt, *requeue* (the previous attempt's result → its
  ``job.restart_ready``) and *backoff* (→ its ``retry_at``: the retry policy's wait);
  *dispatch*, the time from a slot of its pilot falling free (or the attempt becoming
  eligible, if later) to its lease — the slot each run took is reconstructed by replaying
  its pilot's leases in order, first free slot first, as the simulator itself hands them
  out; the pilot's time in the slot besides the process (spawn and report); and *finish*,
  the last result → ``job.finished`` (staging out, postprocessing) or ``job.failed``.
* **Hand-backs**: a job that waited for room while its pilot had a slot free was fetched
  and handed back (nak'ed) until a node had room, and leased at one of those offers, not
  when the room came: its dispatch is only that offer → the lease (the median dispatch of
  the runs that were not handed back), and the offer's moment is kept as the phase of its
  hand-back cycle. The cycle's period is the spacing of such leases when it shows (jobs
  handed back together come back together), else the pilot's :data:`HAND_BACK_S`.
* **Run times**: each run's process run time (the pilot's profile when it recorded one).
* **Capacity**: the pilots from their ``session.opened``: their nodes, a slot per core,
  open from their first lease (a pilot's own start is not its first jobs' dispatch delay).
  Each job of one node holds the share of a node the pilot's packer gives it: of ``c``
  cores, ``c`` over as many such jobs as fit (``c // ranks_per_node``, at most its
  ``node_packing_count``). A pilot seen only in ``job.started`` (a feed without session
  events) is taken to have opened at its first lease, with the nodes its runs'
  placements name, each as wide as the most runs it was seen to hold at once (one node,
  if no placement was recorded); a job then holds one slot.
* **I/O** (optional): with an I/O fraction and the bandwidth of the storage the run read
  from, that fraction of each run, at its start, is I/O, and the bytes it moved are what
  its share of the bandwidth carried in that time, shared equally among the runs of its
  site doing I/O at each moment — the simulator's own rule, so that replaying the
  recording at that bandwidth gives the recording back.
"""

from __future__ import annotations

import bisect
import itertools
import statistics
import uuid
from collections import defaultdict
from dataclasses import dataclass, replace

from lodestream.client.analytics.simulate.errors import BadScenario, NothingToCalibrate
from lodestream.client.analytics.simulate.model import (
    HAND_BACK_S,
    KEPT_PER_PILOT,
    Attempt,
    JobTrace,
    PilotShape,
    Storage,
)
from lodestream.client.analytics.simulate.recorded import (
    RecordedJob,
    RecordedPilot,
    RecordedRun,
    Recording,
)


@dataclass(frozen=True, slots=True)
class IOModel:
    """``io_fraction`` of each recorded run was I/O against storage of ``bandwidth`` bytes/s."""

    io_fraction: float
    bandwidth: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.io_fraction < 1.0:
            raise BadScenario(f"I/O fraction must be within [0, 1), got {self.io_fraction}")
        if not self.bandwidth > 0:
            raise BadScenario(f"recorded bandwidth must be positive, got {self.bandwidth}")


@dataclass(frozen=True, slots=True)
class Calibration:
    jobs: tuple[JobTrace, ...]
    pilots: dict[str, tuple[PilotShape, ...]]
    capacity_source: str
    makespan_s: float  # first submission → last job.finished, as recorded
    storage: Storage | None
    stages: dict[str, float]  # the median of each stage, for the report
    retries: int = 0  # runs beyond each job's first
    dependent: int = 0  # jobs with parents in the recording
    hand_back_s: float = HAND_BACK_S  # a pilot's hand-back delay (its nak), as recorded
    # Jobs a full pilot keeps for its next free slot (launcher.prefetch; 0: none).
    kept_per_pilot: int = KEPT_PER_PILOT
    handed_back: int = 0  # runs handed back before their lease

    @property
    def throughput_per_s(self) -> float:
        return len(self.jobs) / self.makespan_s if self.makespan_s > 0 else 0.0


def calibrate(recorded: Recording, io: IOModel | None = None) -> Calibration:
    """The trace of ``recorded``; :class:`NothingToCalibrate` if no job ran to its end."""
    jobs = recorded.jobs
    if not any(j.runs for j in jobs):
        why = f" ({recorded.unfinished} job(s) seen, none finished)" if recorded.unfinished else ""
        raise NothingToCalibrate(f"no job in the recording ran to JOB_FINISHED{why}")
    t0 = min(j.created for j in jobs)
    pilots, source = _pilots(jobs, recorded.pilots)
    known = {p.session: p for p in recorded.pilots}  # pilots whose nodes' cores are known
    width = {p.session: p.slots_per_node for ps in pilots.values() for p in ps}
    dispatch = _dispatch(jobs, pilots, set(known))
    back = [d for d in dispatch.values() if d.offered is not None]
    period = hand_back_period([d.offered for d in back if d.offered is not None])
    phase = hand_back_phases([d.offered for d in back if d.offered is not None], period)
    moved = _io_bytes(jobs, io) if io is not None else {}
    index = {j.job_id: i for i, j in enumerate(jobs)}
    traces = []
    for job in jobs:
        parents = tuple(index[p] for p in job.parents if p in index)
        after = max([job.created, *(jobs[p].ended for p in parents)])
        attempts = []
        before = job.first_runnable
        for k, run in enumerate(job.runs):
            io_part = io.io_fraction * run.run_s if io is not None else 0.0
            attempts.append(Attempt(
                dispatch_s=dispatch[(job.job_id, k)].delay_s,
                overhead_s=run.held_s - run.run_s,
                compute_s=run.run_s - io_part, io_bytes=moved.get((job.job_id, k), 0.0),
                requeue_s=max(run.runnable - before, 0.0) if k else 0.0,
                backoff_s=max(run.eligible - (run.runnable if k else before), 0.0),
                order=run.started - t0, offered=_phase(dispatch[(job.job_id, k)], phase, t0),
            ))  # fmt: skip
            before = run.result
        ready = max(job.first_runnable - after, 0.0) if job.runs else 0.0
        seen = job.runs[0].session if job.runs else None
        units = _units(job, max(width[seen])) if seen is not None and seen in known else 1
        traces.append(JobTrace(
            site=job.site, app=job.app, num_nodes=job.num_nodes, arrival=job.created - t0,
            prepare_s=ready, attempts=tuple(attempts), parents=parents,
            units=units,
            finish_s=max(job.ended - (job.result if job.runs else after), 0.0),
        ))  # fmt: skip
    shapes = {site: tuple(PilotShape(max(p.opened - t0, 0.0), p.slots_per_node) for p in ps)
              for site, ps in pilots.items()}  # fmt: skip
    runs = [run for job in jobs for run in job.runs]
    tried = [a for t in traces for a in t.attempts]
    stages = {
        "prepare_s": statistics.median(t.prepare_s for t in traces),
        "dispatch_s": statistics.median(a.dispatch_s for a in tried),
        "overhead_s": statistics.median(a.overhead_s for a in tried),
        "run_s": statistics.median(r.run_s for r in runs),
        "finish_s": statistics.median(t.finish_s for t in traces),
    }
    return Calibration(
        jobs=tuple(traces), pilots=shapes, capacity_source=source,
        makespan_s=max(j.ended for j in jobs) - t0,
        storage=Storage(io.bandwidth) if io is not None else None, stages=stages,
        retries=len(runs) - sum(1 for j in jobs if j.runs),
        dependent=sum(1 for t in traces if t.parents),
        hand_back_s=period, handed_back=len(back),
    )  # fmt: skip


PERIOD_SLACK = 0.05


def _phase(run: _Dispatch, phase: dict[float, float], t0: float) -> float | None:
    return phase[run.offered] - t0 if run.offered is not None else None


def hand_back_period(offered: list[float], default: float = HAND_BACK_S) -> float:
    """The pilots' hand-back delay as the leases of handed-back runs show it, else ``default``.

    Jobs a pilot fetched together and handed back together come back together, every delay
    plus the redelivery's latency (3 to 4 ms a cycle on a loaded machine: over a few cycles,
    enough to decide whether a node that frees up just then is seen at the next offer). So
    such leases are whole cycles apart: each gap within 5 % a cycle of a whole number of
    ``default`` cycles gives a cycle's length; their median is the delay. Gaps far from it
    are leases of other cycles' phases and say nothing of the period.
    """
    periods = []
    times = sorted(offered)
    for gap in (b - a for a, b in itertools.pairwise(times)):
        cycles = round(gap / default)
        if cycles >= 1 and abs(gap / cycles - default) <= default * PERIOD_SLACK:
            periods.append(gap / cycles)
    return statistics.median(periods) if periods else default


def hand_back_phases(offered: list[float], period: float) -> dict[float, float]:
    """Each offer → the moment of its phase: offers whole periods apart (within 5 % of one)
    are of jobs a pilot fetched together and handed back together. Replayed, they come
    back at one instant, in their queue's order (the recorded leases'), not in that of a
    millisecond of drift of an estimated period; the latest of theirs, moved onto one
    cycle, so that none is offered before the room it was leased into came."""
    phases: list[list[tuple[float, float]]] = []  # (offer, moved onto the first's cycle)
    for at in sorted(offered):
        for phase in phases:
            cycles = (at - phase[0][0]) / period
            if abs(cycles - round(cycles)) <= PERIOD_SLACK:
                phase.append((at, at - round(cycles) * period))
                break
        else:
            phases.append([(at, at)])
    return {at: max(m for _, m in phase) for phase in phases for at, _ in phase}


def _pilots(
    jobs: list[RecordedJob], opened: list[RecordedPilot]
) -> tuple[dict[str, list[RecordedPilot]], str]:
    """The pilots that ran ``jobs``, by site, and where their shape came from."""
    known = {p.session: p for p in opened}
    used: dict[uuid.UUID, list[tuple[RecordedJob, RecordedRun]]] = defaultdict(list)
    for job in jobs:
        for run in job.runs:
            used[run.session].append((job, run))
    by_site: dict[str, list[RecordedPilot]] = defaultdict(list)
    inferred = 0
    for session, ran in used.items():
        pilot = known.get(session)
        if pilot is not None:
            # Open from its first lease: a pilot's start (its consumer, its first fetch)
            # is its own, not the first jobs' dispatch delay.
            first = min(run.started for _, run in ran)
            pilot = replace(pilot, opened=max(pilot.opened, first))
        else:
            inferred += 1
            runs = [run for _, run in ran]
            pilot = RecordedPilot(session, ran[0][0].site, min(r.started for r in runs),
                                  _nodes_seen(runs))  # fmt: skip
        by_site[pilot.site].append(pilot)
    for pilots in by_site.values():
        pilots.sort(key=lambda p: p.opened)
    if not inferred:
        return by_site, "session events"
    if inferred == len(used):
        return by_site, "job.started placements (no session events)"
    return by_site, f"session events; {inferred} pilot(s) inferred from job.started placements"


def _units(job: RecordedJob, cores: int) -> int:
    """The slots (cores) of a node of ``cores`` that ``job`` holds: its packer places
    ``cores // ranks`` such jobs on it, and at most its ``node_packing_count``."""
    shares = max(min(cores // max(job.ranks_per_node, 1), job.per_node), 1)
    return max(cores // shares, 1)


def _nodes_seen(runs: list[RecordedRun]) -> tuple[int, ...]:
    """A node per host the placements name, each as wide as the most runs it held at once."""
    by_host: dict[str, list[RecordedRun]] = defaultdict(list)
    for run in runs:
        for host in dict.fromkeys(run.hosts):
            by_host[host].append(run)
    if not by_host:
        return (_most_at_once(runs),)
    return tuple(_most_at_once(by_host[host]) for host in sorted(by_host))


def _most_at_once(runs: list[RecordedRun]) -> int:
    edges = sorted([(r.started, 1) for r in runs] + [(r.result, -1) for r in runs])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return max(most, 1)


@dataclass(frozen=True, slots=True)
class _Dispatch:
    delay_s: float  # room (or eligible) → lease; from the last offer if handed back
    offered: float | None = None  # that offer (POSIX seconds), if it was handed back


def _dispatch(
    jobs: list[RecordedJob], pilots: dict[str, list[RecordedPilot]], known: set[uuid.UUID]
) -> dict[tuple[uuid.UUID, int], _Dispatch]:
    """Each run's lease delay from the moment a node of its pilot had room for it.

    The runs are placed in lease order as the simulator places them (the first node with
    room for the job's share); the room came when the node last went from too full for it
    to enough, among the runs placed before it. A run that waited for room while a slot of
    its pilot was free was handed back meanwhile (:func:`_slot_free`): its delay is the
    others' median, counted back from its lease to the offer it was leased at.
    """
    slots = {p.session: p for ps in pilots.values() for p in ps}
    by_pilot: dict[uuid.UUID, list[tuple[RecordedJob, int, RecordedRun]]] = defaultdict(list)
    for job in jobs:
        for k, run in enumerate(job.runs):
            by_pilot[run.session].append((job, k, run))
    delays: dict[tuple[uuid.UUID, int], float] = {}
    handed: list[tuple[tuple[uuid.UUID, int], float]] = []  # (run, its lease)
    for session, ran in by_pilot.items():
        pilot = slots[session]
        size = pilot.slots_per_node
        held: list[list[tuple[float, float, int]]] = [[] for _ in size]  # (lease, end, units)
        for job, k, run in sorted(ran, key=lambda r: r[2].started):
            units = _units(job, max(size)) if session in known else 1
            room = run.started  # no node had room: it was leased as a slot was reported free
            placed: tuple[int, int] | None = None
            for j, node in enumerate(size):
                need = min(units, node)
                if _fits(held[j], node, need, run.started):
                    room = _room_since(held[j], node, need, run.started, pilot.opened)
                    placed = (j, need)
                    break
            since = max(run.eligible, pilot.opened)
            # A job of one slot fits wherever a slot is free: only a wider one is handed back.
            wide = placed is not None and placed[1] > 1
            if wide and since < room and _slot_free(held, size, since, room):
                handed.append(((job.job_id, k), run.started))
            delays[(job.job_id, k)] = max(run.started - max(run.eligible, room), 0.0)
            if placed is not None:
                held[placed[0]].append((run.started, max(run.result, run.started), placed[1]))
    out = {key: _Dispatch(delay) for key, delay in delays.items()}
    back = dict(handed)
    others = [delay for key, delay in delays.items() if key not in back]
    typical = statistics.median(others) if others else 0.0
    for key, lease in handed:
        if delays[key] > typical:  # within a dispatch of the room: it took the room as it came
            out[key] = _Dispatch(typical, lease - typical)
    return out


def _fits(held: list[tuple[float, float, int]], size: int, need: int, at: float) -> bool:
    return size - sum(u for b, e, u in held if b <= at < e) >= need


def _slot_free(held: list[list[tuple[float, float, int]]], size: tuple[int, ...], since: float,
               until: float) -> bool:  # fmt: skip
    """Whether a node had a slot free at some moment in [since, until): the pilot fetched
    then, and handed back what it could not place (it fetches only with a slot free)."""
    moments = {since} | {e for node in held for _, e, _ in node if since < e < until}
    return any(_fits(node, width, 1, at) for at in moments
               for node, width in zip(held, size, strict=True))  # fmt: skip


def _room_since(held: list[tuple[float, float, int]], size: int, need: int, at: float,
                opened: float) -> float:  # fmt: skip
    """Since when a node of ``size`` slots, holding ``held``, had ``need`` free until ``at``."""
    changes = sorted({e for _, e, _ in held if e <= at} | {b for b, _, _ in held if b <= at})
    for moment in reversed(changes):
        used = sum(u for b, e, u in held if b < moment <= e)  # just before it
        if size - used < need:
            return moment
    return opened


def _io_bytes(jobs: list[RecordedJob], io: IOModel) -> dict[tuple[uuid.UUID, int], float]:
    """The bytes each run read: its I/O span (the first ``io_fraction`` of its process's
    run) at ``bandwidth`` shared equally among its site's runs reading at each moment."""
    by_site: dict[str, list[tuple[float, float, tuple[uuid.UUID, int]]]] = defaultdict(list)
    for job in jobs:
        for k, run in enumerate(job.runs):
            begin = run.result - run.run_s
            by_site[job.site].append((begin, begin + io.io_fraction * run.run_s, (job.job_id, k)))
    moved: dict[tuple[uuid.UUID, int], float] = {}
    for spans in by_site.values():
        # Each moment's share, integrated: bytes a reader active all along would have had.
        edges = sorted([(b, 1) for b, _, _ in spans] + [(e, -1) for _, e, _ in spans])
        times, carried = [edges[0][0]], [0.0]
        active = 0
        for at, step in edges:
            if active:
                carried.append(carried[-1] + (at - times[-1]) * io.bandwidth / active)
            else:
                carried.append(carried[-1])
            times.append(at)
            active += step
        for begin, end, key in spans:
            moved[key] = _carried_at(times, carried, end) - _carried_at(times, carried, begin)
    return moved


def _carried_at(times: list[float], carried: list[float], at: float) -> float:
    return carried[bisect.bisect_right(times, at) - 1]
