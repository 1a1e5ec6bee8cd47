"""How soon a site would finish one more job: ``fastest_eta``'s estimate, pure, over read rows.

A site's capacity is what its open pilots can run, not what it happened to finish lately:

* **slots**: how many jobs of this job's shape the open pilots run at once, by the packer's
  rule (:mod:`lodestream.platform_adapters.packing`): a one-node job fits
  ``min(node_packing_count, cores // cpus, gpus // gpus)`` times on each node big enough for
  it; a job of ``n`` nodes fits once per ``n`` nodes big enough;
* **run time**: the median of the last :data:`RUN_SAMPLE` runs (RUNNING → run end) of the
  job's app at the site within :data:`RUN_WINDOW_S`; else of any app there; else of the app
  at the caller's other sites; else :data:`DEFAULT_RUN_S`;
* **work ahead**: the jobs at the site that still need a slot (:data:`SLOT_STATES`), each
  at its own app's run time there, plus the jobs this request has already put there.

The next job finishes at ``wait + (floor(ahead / (slots * run)) + 1) * run``: as if the work
ahead were spread evenly over the slots, in whole waves of this job's run time (exact for
a queue of one app). ``wait`` is 0 with an open pilot. A site with no open pilot that fits
the job is taken to get one of a single slot after :data:`NO_PILOT_WAIT_S`: it is assumed
slow to start, not dead, so it still gets work when every other site is further behind.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from lodestream.platform_adapters.packing import JobRequest
from lodestream.schemas.resources import JobResources
from lodestream.schemas.states import NON_FINAL, JobState

RUN_SAMPLE: Final = 20
RUN_WINDOW_S: Final = 3600.0
DEFAULT_RUN_S: Final = 60.0
NO_PILOT_WAIT_S: Final = 3600.0
SLOT_STATES: Final = NON_FINAL - {JobState.RUN_DONE, JobState.POSTPROCESSED, JobState.STAGED_OUT}
"""Jobs that still hold or wait for a slot: everything not final whose run is not over."""
_WAVE_SLACK: Final = 1e-9  # a sum of run times must not fall a hair short of a whole wave


@dataclass(frozen=True, slots=True)
class Node:
    """One node of an open pilot, as its ``session.opened`` gave it."""

    cores: int
    gpus: int = 0


@dataclass(frozen=True, slots=True)
class SiteCapacity:
    """What the read models say of one site's power to run jobs."""

    pilots: tuple[tuple[Node, ...], ...] = ()  # the nodes of each open pilot
    run_s: Mapping[str, float] = field(default_factory=dict)  # app -> median run time here
    any_run_s: float | None = None  # the median run time of any app here
    queued: Mapping[str, int] = field(default_factory=dict)  # app -> jobs in SLOT_STATES here


@dataclass(frozen=True, slots=True)
class Estimate:
    """When one more job of an app would finish at a site, and what that is made of."""

    slots: int
    run_s: float
    wait_s: float
    ahead_s: float  # slot-seconds of work queued before it

    @classmethod
    def at(cls, fit: int, run_s: float, ahead_s: float) -> Estimate:
        """With ``fit`` slots for the job in the open pilots (0: no open pilot fits it)."""
        if fit:
            return cls(slots=fit, run_s=run_s, wait_s=0.0, ahead_s=ahead_s)
        return cls(slots=1, run_s=run_s, wait_s=NO_PILOT_WAIT_S, ahead_s=ahead_s)

    @property
    def throughput_per_s(self) -> float:
        return self.slots / self.run_s

    @property
    def eta_s(self) -> float:
        waves = math.floor(self.ahead_s / (self.slots * self.run_s) + _WAVE_SLACK)
        return self.wait_s + (waves + 1) * self.run_s


def slots(pilots: Iterable[Sequence[Node]], resources: JobResources) -> int:
    """How many jobs shaped as ``resources`` the ``pilots`` run at once."""
    need = JobRequest.from_resources("estimate", resources)
    total = 0
    for nodes in pilots:
        fitting = [
            n for n in nodes if n.cores >= need.cpus_per_node and n.gpus >= need.gpus_per_node
        ]
        if need.num_nodes > 1:
            total += len(fitting) // need.num_nodes
            continue
        for node in fitting:
            by_gpus = node.gpus // need.gpus_per_node if need.gpus_per_node else node.cores
            total += min(need.node_packing_count, node.cores // need.cpus_per_node, by_gpus)
    return total


def _median(runs: Sequence[float]) -> float | None:
    return statistics.median(runs) if runs else None


def read_capacities(
    sites: Iterable[str],
    pilots: Iterable[tuple[str, Sequence[Mapping[str, Any]]]],
    runs: Iterable[tuple[str, str, float]],
    queued: Iterable[tuple[str, str, int]],
) -> tuple[dict[str, SiteCapacity], RunTimes]:
    """Each of ``sites``' capacity, and the run times of the apps across them, from the rows
    the read models give: ``(site, nodes)`` per open pilot (``nodes`` as ``session.opened``
    carries them), ``(site, app, run_s)`` per recent run, ``(site, app, count)`` of jobs in
    :data:`SLOT_STATES`. Rows of other sites are ignored."""
    wanted = set(sites)
    nodes: dict[str, list[tuple[Node, ...]]] = {site: [] for site in wanted}
    for site, shape in pilots:
        if site in wanted:
            nodes[site].append(tuple(_node(n) for n in shape))
    at_site: dict[str, dict[str, list[float]]] = {site: {} for site in wanted}
    by_app: dict[str, list[float]] = {}
    for site, app, run_s in runs:
        if site in wanted and run_s > 0:
            at_site[site].setdefault(app, []).append(run_s)
            by_app.setdefault(app, []).append(run_s)
    waiting: dict[str, dict[str, int]] = {site: {} for site in wanted}
    for site, app, count in queued:
        if site in wanted:
            waiting[site][app] = waiting[site].get(app, 0) + count
    capacities = {
        site: SiteCapacity(
            pilots=tuple(nodes[site]),
            run_s={app: statistics.median(r) for app, r in at_site[site].items()},
            any_run_s=_median([r for rs in at_site[site].values() for r in rs]),
            queued=waiting[site],
        )
        for site in sorted(wanted)
    }
    return capacities, RunTimes({app: statistics.median(r) for app, r in by_app.items()})


def _node(row: Mapping[str, Any]) -> Node:
    return Node(cores=int(row["cores"]), gpus=int(row.get("gpus", 0)))


@dataclass(frozen=True, slots=True)
class RunTimes:
    """A run time for every (site, app), by the fallbacks of the module docstring."""

    elsewhere: Mapping[str, float] = field(default_factory=dict)  # app -> median at any site

    def of(self, capacity: SiteCapacity, app: str) -> float:
        for known in (capacity.run_s.get(app), capacity.any_run_s, self.elsewhere.get(app)):
            if known is not None and known > 0:
                return known
        return DEFAULT_RUN_S

    def queued_s(self, capacity: SiteCapacity) -> float:
        """Slot-seconds of the work waiting for or holding a slot at the site."""
        return self.work_s(capacity, capacity.queued)

    def work_s(self, capacity: SiteCapacity, jobs: Mapping[str, int]) -> float:
        """Slot-seconds of ``jobs`` (app -> count) at the site."""
        return sum(n * self.of(capacity, app) for app, n in jobs.items())


def shape_of(resources: JobResources) -> tuple[int, ...]:
    """What :func:`slots` reads of ``resources``: jobs of one shape fit alike."""
    r = resources
    return (r.num_nodes, r.ranks_per_node, r.threads_per_rank, r.threads_per_core,
            r.gpus_per_rank, r.node_packing_count)  # fmt: skip


def estimate(
    capacity: SiteCapacity, app: str, resources: JobResources, ahead_s: float, runs: RunTimes
) -> Estimate:
    """When one more job of ``app`` shaped as ``resources`` would finish at the site, with
    ``ahead_s`` slot-seconds of work before it."""
    return Estimate.at(slots(capacity.pilots, resources), runs.of(capacity, app), ahead_s)
