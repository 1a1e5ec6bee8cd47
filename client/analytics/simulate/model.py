"""The simulator's model: a calibrated trace of jobs, the pilots they run on, a scenario.

The burst-buffer workflow terms (a task is compute plus I/O; storage bandwidth is shared by
the tasks doing I/O at once; the compute part speeds up over the task's nodes by Amdahl's
law) are the two pure functions here, so they can be checked by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from lodestream.client.analytics.simulate.errors import BadScenario
from lodestream.schemas.strategies import STRATEGIES, Strategy

HAND_BACK_S = 0.5
"""How long a pilot hands back a job it cannot place yet (agents/launcher's NAK_DELAY_S):
the simulator's hand-back delay when a recording does not show its own."""
KEPT_PER_PILOT = 2
"""Jobs a full pilot keeps, unleased, for its next free slot (launcher.prefetch's default):
placed the moment room grows, not handed back."""
KEEP_S = 2.0
"""How long a pilot keeps such a job before it hands it back (agents/launcher/offering's
WAIT_MAX_S)."""


def amdahl_s(one_node_s: float, parallel_fraction: float, nodes: int) -> float:
    """The compute time on ``nodes`` nodes of work taking ``one_node_s`` on one node, of which
    ``parallel_fraction`` spreads over the nodes (Amdahl's law)."""
    return one_node_s * ((1.0 - parallel_fraction) + parallel_fraction / nodes)


def io_s(nbytes: float, bandwidth: float, concurrent: int) -> float:
    """The time to move ``nbytes`` while ``concurrent`` tasks share ``bandwidth`` (bytes/s)
    equally, for as long as that many share it."""
    return nbytes / (bandwidth / concurrent)


@dataclass(frozen=True, slots=True)
class Attempt:
    """One run of a job as the simulator replays it.

    ``compute_s`` is on the job's nodes; ``io_bytes`` (0: no I/O modelled) is read from the
    site's shared storage before it computes. ``overhead_s`` is what the pilot spends in
    the slot besides the process (spawning it, reporting it). ``requeue_s`` and
    ``backoff_s`` (0 for a first attempt) are the wait from the previous attempt's result:
    the site deciding to retry, then the retry policy's backoff, before any pilot may take it.

    ``offered`` is set when the pilot handed the attempt back before it leased it (it was
    fetched while no node had room for it): the recorded moment of the offer it was leased
    at, which fixes the phase of its hand-back cycle in the replay; ``dispatch_s`` is then
    only that offer → the lease, the hand-backs' wait being the cycle's.
    """

    dispatch_s: float  # a slot free (or the job eligible, if later) → the lease
    overhead_s: float
    compute_s: float
    io_bytes: float = 0.0
    requeue_s: float = 0.0
    backoff_s: float = 0.0
    order: float | None = None  # its recorded lease (seconds after the first submission)
    offered: float | None = None  # its recorded last offer, if it was handed back (same)


@dataclass(frozen=True, slots=True)
class JobTrace:
    """One job as the simulator replays it: when it came, what it waits for, its attempts.

    ``parents`` are indices into the calibration's jobs: the job is runnable ``prepare_s``
    after its arrival or its last parent's end, whichever is later (the controller's steps,
    staging in, preprocessing). Its attempts run in turn; it ends ``finish_s`` after the
    last one's result (staging out, postprocessing, or giving up). A job with no attempt
    (failed before it ran) ends ``finish_s`` after it would have become runnable.
    """

    site: str
    app: str
    num_nodes: int
    arrival: float  # seconds after the run's first submission
    prepare_s: float  # arrival or parents' end → runnable
    attempts: tuple[Attempt, ...]
    finish_s: float  # the last result → job.finished (or job.failed)
    parents: tuple[int, ...] = ()
    units: int = 1  # the slots of a node it holds (one node's job: its share of the node)


@dataclass(frozen=True, slots=True)
class PilotShape:
    """A pilot: when it can take work (seconds after the first submission), its nodes' slots."""

    opens_at: float
    slots_per_node: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Storage:
    """The shared storage tier tasks read from: its bandwidth (bytes/s) during the recording."""

    bandwidth: float


@dataclass(frozen=True, slots=True)
class Scenario:
    """What differs from the recording; None keeps what was recorded.

    Capacity is per site: ``pilots`` per site, ``nodes`` per pilot, ``slots`` per node.
    ``strategy`` re-routes every job across the recorded sites as ``site: "auto"`` would.
    ``bandwidth``: the storage tier's (needs an I/O model in the calibration).
    ``nodes_per_job`` with ``parallel_fraction``: Amdahl speed-up of the compute part.
    ``pilots_factor``: each site's recorded pilots, that many times over. ``jobs_factor``:
    the workload submitted that many times (each copy with its own dependencies), at the
    recorded times. ``arrival_rate``: submissions re-spaced evenly at that many a second,
    in the recorded order. ``bandwidth_factor``: the storage tier that many times as fast.
    ``speed``: runs that many times as fast (another site's speed: the ratio of its run
    times to the recorded ones).
    """

    pilots: int | None = None
    nodes: int | None = None
    slots: int | None = None
    strategy: Strategy | None = None
    bandwidth: float | None = None
    nodes_per_job: int | None = None
    parallel_fraction: float = 1.0
    sites: dict[str, tuple[int | None, int | None, int | None]] = field(default_factory=dict)
    pilots_factor: int | None = None
    jobs_factor: int | None = None
    arrival_rate: float | None = None
    bandwidth_factor: float | None = None
    speed: float | None = None

    def __post_init__(self) -> None:
        counts = {"pilots": self.pilots, "nodes": self.nodes, "slots": self.slots,
                  "nodes per job": self.nodes_per_job, "pilots factor": self.pilots_factor,
                  "jobs factor": self.jobs_factor}  # fmt: skip
        rates = {"arrival rate": self.arrival_rate, "bandwidth factor": self.bandwidth_factor,
                 "speed": self.speed}  # fmt: skip
        for name, rate in rates.items():
            if rate is not None and not (rate > 0 and math.isfinite(rate)):
                raise BadScenario(f"{name} must be a positive number, got {rate}")
        for name, value in counts.items():
            if value is not None and not 1 <= value <= 1_000_000:
                raise BadScenario(f"{name} must be between 1 and 1,000,000, got {value}")
        for site, shape in self.sites.items():
            for value in shape:
                if value is not None and not 1 <= value <= 1_000_000:
                    raise BadScenario(f"capacity of site {site!r} must be counts of at least 1")
        if self.strategy is not None and self.strategy not in STRATEGIES:
            raise BadScenario(f"unknown strategy {self.strategy!r}; one of {', '.join(STRATEGIES)}")
        if self.bandwidth is not None and not (
            self.bandwidth > 0 and math.isfinite(self.bandwidth)
        ):
            raise BadScenario(
                f"bandwidth must be a positive number of bytes/s, got {self.bandwidth}"
            )
        if not 0.0 <= self.parallel_fraction <= 1.0:
            raise BadScenario(
                f"parallel fraction must be within [0, 1], got {self.parallel_fraction}"
            )

    def pilots_of(self, site: str, recorded: tuple[PilotShape, ...]) -> tuple[PilotShape, ...]:
        """The pilots ``site`` has in this scenario. Added pilots open when the recorded ones
        did, in turn; a changed node count keeps the recorded slots of a node."""
        pilots, nodes, slots = self.sites.get(site, (None, None, None))
        pilots, nodes, slots = pilots or self.pilots, nodes or self.nodes, slots or self.slots
        count = pilots or len(recorded) * (self.pilots_factor or 1)
        shaped = []
        for i in range(count):
            base = recorded[i % len(recorded)]
            per_node = base.slots_per_node
            if nodes is not None:
                per_node = tuple(per_node[j % len(per_node)] for j in range(nodes))
            if slots is not None:
                per_node = (slots,) * len(per_node)
            shaped.append(PilotShape(base.opens_at, per_node))
        return tuple(shaped)


def workload(jobs: tuple[JobTrace, ...], scenario: Scenario) -> tuple[JobTrace, ...]:
    """The jobs ``scenario`` submits: ``jobs_factor`` copies (each copy's parents its own),
    arrivals re-spaced at ``arrival_rate``, compute ``speed`` times as fast."""
    n = len(jobs)
    out = [replace(job, parents=tuple(p + copy * n for p in job.parents))
           for copy in range(scenario.jobs_factor or 1) for job in jobs]  # fmt: skip
    if scenario.arrival_rate is not None:
        order = sorted(range(len(out)), key=lambda i: (out[i].arrival, i))
        for rank, i in enumerate(order):  # the recorded lease order is no longer the order
            attempts = tuple(replace(a, order=None, offered=None) for a in out[i].attempts)
            out[i] = replace(out[i], arrival=rank / scenario.arrival_rate, attempts=attempts)
    if scenario.speed is not None:
        speed = scenario.speed
        out = [replace(job, attempts=tuple(replace(a, compute_s=a.compute_s / speed)
                                           for a in job.attempts)) for job in out]  # fmt: skip
    return tuple(out)
