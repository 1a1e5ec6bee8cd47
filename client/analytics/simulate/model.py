"""The simulator's model: a calibrated trace of jobs, the pilots they run on, a scenario.

The burst-buffer workflow terms (a task is compute plus I/O; storage bandwidth is shared by
the tasks doing I/O at once; the compute part speeds up over the task's nodes by Amdahl's
law) are the two pure functions here, so they can be checked by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from lodestream.client.analytics.simulate.errors import BadScenario
from lodestream.schemas.strategies import STRATEGIES, Strategy


def amdahl_s(one_node_s: float, parallel_fraction: float, nodes: int) -> float:
    """The compute time on ``nodes`` nodes of work taking ``one_node_s`` on one node, of which
    ``parallel_fraction`` spreads over the nodes (Amdahl's law)."""
    return one_node_s * ((1.0 - parallel_fraction) + parallel_fraction / nodes)


def io_s(nbytes: float, bandwidth: float, concurrent: int) -> float:
    """The time to move ``nbytes`` while ``concurrent`` tasks share ``bandwidth`` (bytes/s)
    equally, for as long as that many share it."""
    return nbytes / (bandwidth / concurrent)


@dataclass(frozen=True, slots=True)
class JobTrace:
    """One job as the simulator replays it: when it came, what each stage cost it.

    ``compute_s`` is on ``num_nodes`` nodes; ``io_bytes`` (0: no I/O modelled) is read from
    the site's shared storage before it computes. ``overhead_s`` is what the pilot spends in
    the slot besides the process (spawning it, reporting it).
    """

    site: str
    app: str
    num_nodes: int
    arrival: float  # seconds after the run's first submission
    prepare_s: float  # created → runnable (controller, site processing)
    dispatch_s: float  # a slot free (or the job runnable, if later) → the lease
    overhead_s: float
    compute_s: float
    io_bytes: float
    finish_s: float  # the run's result → job.finished


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
    """

    pilots: int | None = None
    nodes: int | None = None
    slots: int | None = None
    strategy: Strategy | None = None
    bandwidth: float | None = None
    nodes_per_job: int | None = None
    parallel_fraction: float = 1.0
    sites: dict[str, tuple[int | None, int | None, int | None]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        counts = {"pilots": self.pilots, "nodes": self.nodes, "slots": self.slots,
                  "nodes per job": self.nodes_per_job}  # fmt: skip
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
        count = pilots or len(recorded)
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
