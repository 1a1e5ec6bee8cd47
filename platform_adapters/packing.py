"""Packing jobs onto a pilot's nodes. Pure bookkeeping: no I/O, no clocks.

The rules are Balsam's:

* a single-node job (``num_nodes == 1``) needs ``ceil(ranks_per_node * threads_per_rank /
  threads_per_core)`` cpus, ``ranks_per_node * gpus_per_rank`` gpus and ``1/node_packing_count``
  of the occupancy of one node;
* a multi-node job needs ``num_nodes`` completely idle nodes and holds them exclusively (all of
  their cpus and gpus). Unlike Balsam, those nodes must also be big enough for its per-node cpus
  and gpus, so that a request that can never run is refused rather than started oversubscribed.

Small jobs go to the busiest partially used node they fit on (best fit), and only then to an idle
node, so that idle nodes stay available for multi-node jobs. ``allocate`` is O(nodes).
``wall_time_min`` is carried for the launcher's own "can it finish before my wall time" check; the
packer does not look at it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from lodestream.platform_adapters.compute.base import (
    OCCUPANCY_SLACK,
    ComputeNode,
    NodePlacement,
    NodeSpec,
)
from lodestream.platform_adapters.errors import InvalidNodeSpec, InvalidRequest, UnknownJob

if TYPE_CHECKING:
    from lodestream.schemas.resources import JobResources

_AT_LEAST_ONE = (
    "num_nodes",
    "ranks_per_node",
    "threads_per_rank",
    "threads_per_core",
    "node_packing_count",
)


@dataclass(frozen=True, slots=True)
class JobRequest:
    """What one job asks of the pilot's nodes (Balsam's resource vocabulary)."""

    job_id: str
    num_nodes: int = 1
    ranks_per_node: int = 1
    threads_per_rank: int = 1
    threads_per_core: int = 1
    gpus_per_rank: int = 0
    node_packing_count: int = 1
    wall_time_min: int = 0
    # Derived once: allocate() reads them thousands of times per second.
    cpus_per_node: int = field(init=False, compare=False)
    gpus_per_node: int = field(init=False, compare=False)
    occupancy: float = field(init=False, compare=False)

    def __post_init__(self) -> None:
        if not self.job_id:
            raise InvalidRequest("a job request needs a job id")
        for name in _AT_LEAST_ONE:
            if getattr(self, name) < 1:
                raise InvalidRequest(f"job {self.job_id}: {name} must be at least 1")
        for name in ("gpus_per_rank", "wall_time_min"):
            if getattr(self, name) < 0:
                raise InvalidRequest(f"job {self.job_id}: {name} must not be negative")
        threads = self.ranks_per_node * self.threads_per_rank
        object.__setattr__(self, "cpus_per_node", -(-threads // self.threads_per_core))
        object.__setattr__(self, "gpus_per_node", self.ranks_per_node * self.gpus_per_rank)
        object.__setattr__(
            self, "occupancy", 1.0 if self.num_nodes > 1 else 1.0 / self.node_packing_count
        )

    @classmethod
    def from_resources(cls, job_id: str, resources: JobResources) -> JobRequest:
        """The request of a job as submitted (``lodestream.schemas.resources.JobResources``)."""
        return cls(
            job_id=job_id,
            num_nodes=resources.num_nodes,
            ranks_per_node=resources.ranks_per_node,
            threads_per_rank=resources.threads_per_rank,
            threads_per_core=resources.threads_per_core,
            gpus_per_rank=resources.gpus_per_rank,
            node_packing_count=resources.node_packing_count,
            wall_time_min=resources.wall_time_min,
        )


@dataclass(frozen=True, slots=True)
class Allocation:
    """Where a job runs: one placement per node, in the order the nodes were given."""

    job_id: str
    placements: tuple[NodePlacement, ...]

    @property
    def hostnames(self) -> tuple[str, ...]:
        return tuple(p.hostname for p in self.placements)

    @property
    def num_nodes(self) -> int:
        return len(self.placements)


class NodePacker:
    """Allocates jobs to a fixed set of nodes and frees them again. Not thread-safe."""

    def __init__(self, nodes: Iterable[NodeSpec]) -> None:
        self._nodes = tuple(ComputeNode(spec) for spec in nodes)
        self._by_host = {node.hostname: node for node in self._nodes}
        if len(self._by_host) != len(self._nodes):
            raise InvalidNodeSpec("node hostnames must be unique")
        # Every node is in exactly one of these, so that a saturated pilot does not scan its
        # full nodes on every allocate. Order follows the nodes' as far as churn allows.
        self._idle: dict[str, ComputeNode] = dict(self._by_host)
        self._partial: dict[str, ComputeNode] = {}
        self._full: dict[str, ComputeNode] = {}
        self._home: dict[str, dict[str, ComputeNode]] = dict.fromkeys(self._by_host, self._idle)
        self._allocations: dict[str, Allocation] = {}
        shapes = {(len(n.spec.cpu_ids), len(n.spec.gpu_ids)) for n in self._nodes}
        self._uniform = len(shapes) <= 1

    @property
    def nodes(self) -> tuple[ComputeNode, ...]:
        return self._nodes

    @property
    def allocations(self) -> Mapping[str, Allocation]:
        return MappingProxyType(self._allocations)

    @property
    def idle_node_count(self) -> int:
        return len(self._idle)

    def allocation(self, job_id: str) -> Allocation | None:
        return self._allocations.get(job_id)

    def can_ever_fit(self, request: JobRequest) -> str | None:
        """Why ``request`` can never run on these nodes, or ``None`` if it can once they free up."""
        if request.num_nodes > len(self._nodes):
            return f"needs {request.num_nodes} nodes; this pilot has {len(self._nodes)}"
        big_enough = sum(1 for node in self._nodes if _capacity_fits(node, request))
        if big_enough >= request.num_nodes:
            return None
        need = f"{request.cpus_per_node} cpus and {request.gpus_per_node} gpus"
        if request.num_nodes == 1:
            shapes = sorted({(len(n.spec.cpu_ids), len(n.spec.gpu_ids)) for n in self._nodes})
            have = ", ".join(f"{c} cpus/{g} gpus" for c, g in shapes)
            return f"needs {need} on one node; the nodes have {have or 'nothing'}"
        return (
            f"needs {request.num_nodes} nodes with {need} each; "
            f"only {big_enough} of {len(self._nodes)} nodes are that big"
        )

    def allocate(self, request: JobRequest, prefer: Sequence[str] = ()) -> Allocation | None:
        """Place the job now, or return ``None`` if it has to wait for something to be released.

        A request that can never fit also returns ``None``; check ``can_ever_fit`` before
        queueing it. A one-node job goes to the first node of ``prefer`` (hostnames, e.g.
        those whose caches hold its inputs) it fits on now: a preference, never a refusal.
        """
        if request.job_id in self._allocations:
            raise InvalidRequest(f"job {request.job_id} is already allocated")
        if request.num_nodes == 1:
            node = self._pick_preferred(request, prefer) or self._pick_single(request)
            if node is None:
                return None
            placement = node.assign(
                request.job_id, request.cpus_per_node, request.gpus_per_node, request.occupancy
            )
            self._refile(node)
            allocation = Allocation(request.job_id, (placement,))
        else:
            nodes = self._pick_idle(request)
            if nodes is None:
                return None
            placements = []
            for node in nodes:
                spec = node.spec
                placements.append(
                    node.assign(request.job_id, len(spec.cpu_ids), len(spec.gpu_ids), 1.0)
                )
                self._refile(node)
            allocation = Allocation(request.job_id, tuple(placements))
        self._allocations[request.job_id] = allocation
        return allocation

    def release(self, job_id: str) -> Allocation:
        """Free everything the job holds and return its allocation."""
        try:
            allocation = self._allocations.pop(job_id)
        except KeyError:
            raise UnknownJob(f"job {job_id} holds no allocation") from None
        for placement in allocation.placements:
            node = self._by_host[placement.hostname]
            node.release(job_id)
            self._refile(node)
        return allocation

    def _pick_preferred(self, request: JobRequest, prefer: Sequence[str]) -> ComputeNode | None:
        for hostname in prefer:
            node = self._by_host.get(hostname)
            if node is not None and node.fits(
                request.cpus_per_node, request.gpus_per_node, request.occupancy
            ):
                return node
        return None

    def _pick_single(self, request: JobRequest) -> ComputeNode | None:
        cpus, gpus, occupancy = request.cpus_per_node, request.gpus_per_node, request.occupancy
        best: ComputeNode | None = None
        best_key = (-1.0, 0)
        for node in self._partial.values():
            if node.fits(cpus, gpus, occupancy):
                if node.occupancy + occupancy >= 1.0 - OCCUPANCY_SLACK:
                    return node  # fills the node exactly: no better fit exists
                key = (node.occupancy, -node.idle_cpu_count)
                if key > best_key:
                    best, best_key = node, key
        if best is not None:
            return best
        if self._uniform:
            for node in self._idle.values():
                return node if node.fits(cpus, gpus, occupancy) else None
            return None
        # Heterogeneous nodes: take the smallest idle node that is big enough.
        smallest: ComputeNode | None = None
        for node in self._idle.values():
            if node.fits(cpus, gpus, occupancy) and (
                smallest is None
                or (node.idle_cpu_count, node.idle_gpu_count)
                < (smallest.idle_cpu_count, smallest.idle_gpu_count)
            ):
                smallest = node
        return smallest

    def _pick_idle(self, request: JobRequest) -> list[ComputeNode] | None:
        if len(self._idle) < request.num_nodes:
            return None
        chosen = []
        for node in self._idle.values():
            if _capacity_fits(node, request):
                chosen.append(node)
                if len(chosen) == request.num_nodes:
                    return chosen
        return None

    def _refile(self, node: ComputeNode) -> None:
        if node.is_idle:
            home = self._idle
        elif node.occupancy >= 1.0 - OCCUPANCY_SLACK or not node.idle_cpu_count:
            home = self._full  # every job needs at least one cpu and some occupancy
        else:
            home = self._partial
        if self._home[node.hostname] is not home:
            del self._home[node.hostname][node.hostname]
            home[node.hostname] = node
            self._home[node.hostname] = home


def _capacity_fits(node: ComputeNode, request: JobRequest) -> bool:
    """Whether the node, empty, is big enough for the request's per-node needs."""
    return request.cpus_per_node <= len(node.spec.cpu_ids) and request.gpus_per_node <= len(
        node.spec.gpu_ids
    )
