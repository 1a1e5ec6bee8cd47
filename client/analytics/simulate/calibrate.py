"""From a recording to the trace the simulator replays: per-job stage costs, the pilots.

* **Arrivals**: the recorded submission times, as offsets from the first.
* **Stage overheads**, per job: created → runnable; *dispatch*, the time from a slot of its
  pilot falling free (or the job becoming runnable, if later) to its lease — the slot each
  job took is reconstructed by replaying its pilot's leases in order, first free slot first,
  as the simulator itself hands them out; the pilot's time in the slot besides the process
  (spawn and report); result → job.finished.
* **Run times**: each job's process run time (the pilot's profile when it recorded one).
* **Capacity**: the pilots from their ``session.opened``: their nodes, each with as many
  slots as the pilot's packer gives the jobs it ran — a node's cores over a job's ranks, and
  at most the jobs' ``node_packing_count`` (the most any of them allows). A pilot
  seen only in ``job.started`` (a feed without session events) is taken to have opened at
  its first lease, with one node as wide as the most runs it was seen to hold at once.
* **I/O** (optional): with an I/O fraction and the bandwidth of the storage the run read
  from, that fraction of each run is I/O, and the bytes it moved are what its share of the
  bandwidth (split among the runs of its site going on at its midpoint) carried in that time.
"""

from __future__ import annotations

import bisect
import heapq
import statistics
import uuid
from collections import defaultdict
from dataclasses import dataclass, replace

from lodestream.client.analytics.simulate.errors import BadScenario, NothingToCalibrate
from lodestream.client.analytics.simulate.model import JobTrace, PilotShape, Storage
from lodestream.client.analytics.simulate.recorded import RecordedJob, RecordedPilot, Recording


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

    @property
    def throughput_per_s(self) -> float:
        return len(self.jobs) / self.makespan_s if self.makespan_s > 0 else 0.0


def calibrate(recorded: Recording, io: IOModel | None = None) -> Calibration:
    """The trace of ``recorded``; :class:`NothingToCalibrate` if no job ran to its end."""
    jobs = recorded.jobs
    if not jobs:
        why = f" ({recorded.unfinished} job(s) seen, none finished)" if recorded.unfinished else ""
        raise NothingToCalibrate(f"no job in the recording ran to JOB_FINISHED{why}")
    t0 = min(j.created for j in jobs)
    pilots, source = _pilots(jobs, recorded.pilots)
    dispatch = _dispatch(jobs, pilots)
    concurrency = _concurrency(jobs) if io is not None else {}
    traces = []
    for job in jobs:
        io_part = io.io_fraction * job.run_s if io is not None else 0.0
        nbytes = io_part * io.bandwidth / concurrency[job.job_id] if io is not None else 0.0
        traces.append(JobTrace(
            site=job.site, app=job.app, num_nodes=job.num_nodes, arrival=job.created - t0,
            prepare_s=max(job.runnable - job.created, 0.0), dispatch_s=dispatch[job.job_id],
            overhead_s=job.held_s - job.run_s, compute_s=job.run_s - io_part, io_bytes=nbytes,
            finish_s=max(job.finished - job.result, 0.0),
        ))  # fmt: skip
    shapes = {site: tuple(PilotShape(max(p.opened - t0, 0.0), p.slots_per_node) for p in ps)
              for site, ps in pilots.items()}  # fmt: skip
    stages = {
        "prepare_s": statistics.median(t.prepare_s for t in traces),
        "dispatch_s": statistics.median(t.dispatch_s for t in traces),
        "overhead_s": statistics.median(t.overhead_s for t in traces),
        "run_s": statistics.median(j.run_s for j in jobs),
        "finish_s": statistics.median(t.finish_s for t in traces),
    }
    return Calibration(
        jobs=tuple(traces), pilots=shapes, capacity_source=source,
        makespan_s=max(j.finished for j in jobs) - t0,
        storage=Storage(io.bandwidth) if io is not None else None, stages=stages,
    )  # fmt: skip


def _pilots(
    jobs: list[RecordedJob], opened: list[RecordedPilot]
) -> tuple[dict[str, list[RecordedPilot]], str]:
    """The pilots that ran ``jobs``, by site, and where their shape came from."""
    known = {p.session: p for p in opened}
    used: dict[uuid.UUID, list[RecordedJob]] = defaultdict(list)
    for job in jobs:
        used[job.session].append(job)
    by_site: dict[str, list[RecordedPilot]] = defaultdict(list)
    inferred = 0
    for session, ran in used.items():
        pilot = known.get(session)
        if pilot is not None:
            pilot = _packed(pilot, ran)
        else:
            inferred += 1
            pilot = RecordedPilot(session, ran[0].site, min(j.started for j in ran),
                                  (_most_at_once(ran),))  # fmt: skip
        by_site[pilot.site].append(pilot)
    for pilots in by_site.values():
        pilots.sort(key=lambda p: p.opened)
    if not inferred:
        return by_site, "session events"
    if inferred == len(used):
        return by_site, "inferred from job.started (no session events)"
    return by_site, f"session events; {inferred} pilot(s) inferred from job.started"


def _packed(pilot: RecordedPilot, ran: list[RecordedJob]) -> RecordedPilot:
    """``pilot`` with a slot per job its packer could place at once on each node."""
    ranks = max(j.ranks_per_node for j in ran)
    per_node = max(j.per_node for j in ran)
    slots = tuple(max(min(cores // ranks, per_node), 1) for cores in pilot.slots_per_node)
    return replace(pilot, slots_per_node=slots)


def _most_at_once(jobs: list[RecordedJob]) -> int:
    edges = sorted([(j.started, 1) for j in jobs] + [(j.result, -1) for j in jobs])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return max(most, 1)


def _dispatch(
    jobs: list[RecordedJob], pilots: dict[str, list[RecordedPilot]]
) -> dict[uuid.UUID, float]:
    """Each job's lease delay from the moment a slot of its pilot was free for it."""
    slots = {p.session: p for ps in pilots.values() for p in ps}
    by_pilot: dict[uuid.UUID, list[RecordedJob]] = defaultdict(list)
    for job in jobs:
        by_pilot[job.session].append(job)
    delays: dict[uuid.UUID, float] = {}
    for session, ran in by_pilot.items():
        pilot = slots[session]
        free = [pilot.opened] * max(sum(pilot.slots_per_node), 1)
        for job in sorted(ran, key=lambda j: j.started):
            slot_free = heapq.heappop(free)
            delays[job.job_id] = max(job.started - max(job.runnable, slot_free), 0.0)
            heapq.heappush(free, max(job.result, job.started))
    return delays


def _concurrency(jobs: list[RecordedJob]) -> dict[uuid.UUID, int]:
    """How many runs of its site were going on at the middle of each job's run."""
    by_site: dict[str, list[RecordedJob]] = defaultdict(list)
    for job in jobs:
        by_site[job.site].append(job)
    counts: dict[uuid.UUID, int] = {}
    for ran in by_site.values():
        starts = sorted(j.result - j.run_s for j in ran)
        ends = sorted(j.result for j in ran)
        for job in ran:
            middle = job.result - job.run_s / 2
            counts[job.job_id] = max(_count_le(starts, middle) - _count_le(ends, middle), 1)
    return counts


def _count_le(values: list[float], x: float) -> int:
    return bisect.bisect_right(values, x)
