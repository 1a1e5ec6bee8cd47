"""Compute nodes: what a pilot's nodes hold, and which job holds which cpu and gpu ids.

A ``NodeSpec`` describes a node as discovered (hostname, usable cpu ids, gpu ids). A
``ComputeNode`` is the launcher's live bookkeeping for one node. Occupancy follows Balsam: a job
with ``node_packing_count = k`` takes ``1/k`` of a node, so at most ``k`` such jobs share it,
whatever cpus and gpus they also take.

Discovery backends (local, and one per scheduler in ``discovery``) are functions that satisfy
``NodeDiscovery`` and return one ``NodeSpec`` per node of the allocation.
"""

from __future__ import annotations

import math
from collections.abc import KeysView
from dataclasses import dataclass
from typing import Protocol

from lodestream.platform_adapters.errors import InsufficientResources, InvalidNodeSpec, UnknownJob

# Occupancies are sums of 1/k; float error must not refuse the k-th job of a packing count k.
OCCUPANCY_SLACK = 1e-9


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node as discovered: its hostname and the cpu and gpu ids a launcher may hand out.

    ``gpu_ids`` are strings because they end up in ``CUDA_VISIBLE_DEVICES``, which also accepts
    UUIDs and MIG identifiers.
    """

    hostname: str
    cpu_ids: tuple[int, ...]
    gpu_ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.hostname:
            raise InvalidNodeSpec("a node needs a hostname")
        if len(set(self.cpu_ids)) != len(self.cpu_ids):
            raise InvalidNodeSpec(f"{self.hostname}: duplicate cpu ids {self.cpu_ids}")
        if len(set(self.gpu_ids)) != len(self.gpu_ids):
            raise InvalidNodeSpec(f"{self.hostname}: duplicate gpu ids {self.gpu_ids}")


@dataclass(frozen=True, slots=True)
class NodePlacement:
    """The part of one node given to one job: the concrete cpu and gpu ids it may use."""

    hostname: str
    cpu_ids: tuple[int, ...]
    gpu_ids: tuple[str, ...] = ()


class NodeDiscovery(Protocol):
    """Describe the nodes this pilot runs on.

    Backends take further, backend-specific keyword options (e.g. ``virtual_nodes`` for the local
    backend); the two below are common to all and override what the platform reports.
    """

    def __call__(
        self, *, cores_per_node: int | None = None, gpus_per_node: int | None = None
    ) -> list[NodeSpec]: ...


class ComputeNode:
    """Live bookkeeping of one node: busy cpu/gpu ids, occupancy, and the jobs running on it.

    Cpu ids are handed out lowest first, gpu ids in discovery order. Not thread-safe: one
    launcher loop owns its nodes.
    """

    __slots__ = ("_gpu_order", "_holdings", "_idle_cpus", "_idle_gpus", "occupancy", "spec")

    def __init__(self, spec: NodeSpec) -> None:
        self.spec = spec
        self.occupancy = 0.0
        self._idle_cpus = sorted(spec.cpu_ids)
        self._idle_gpus = list(spec.gpu_ids)
        # GPU ids are strings ("10" sorts before "2"), so they go back in discovery order.
        self._gpu_order = {gpu: i for i, gpu in enumerate(spec.gpu_ids)}
        self._holdings: dict[str, tuple[NodePlacement, float]] = {}

    @property
    def hostname(self) -> str:
        return self.spec.hostname

    @property
    def job_ids(self) -> KeysView[str]:
        """Ids of the jobs holding part of this node (a live view)."""
        return self._holdings.keys()

    @property
    def is_idle(self) -> bool:
        """No job holds anything here; a multi-node job may take the node."""
        return not self._holdings

    @property
    def is_busy(self) -> bool:
        return bool(self._holdings)

    @property
    def idle_cpu_count(self) -> int:
        return len(self._idle_cpus)

    @property
    def idle_gpu_count(self) -> int:
        return len(self._idle_gpus)

    @property
    def idle_cpu_ids(self) -> tuple[int, ...]:
        return tuple(self._idle_cpus)

    @property
    def idle_gpu_ids(self) -> tuple[str, ...]:
        return tuple(self._idle_gpus)

    @property
    def busy_cpu_ids(self) -> frozenset[int]:
        return frozenset(c for p, _ in self._holdings.values() for c in p.cpu_ids)

    @property
    def busy_gpu_ids(self) -> frozenset[str]:
        return frozenset(g for p, _ in self._holdings.values() for g in p.gpu_ids)

    def placement_of(self, job_id: str) -> NodePlacement | None:
        held = self._holdings.get(job_id)
        return held[0] if held is not None else None

    def fits(self, cpus: int, gpus: int, occupancy: float) -> bool:
        """Whether a job needing ``cpus``, ``gpus`` and ``occupancy`` could be assigned now."""
        return (
            self.occupancy + occupancy <= 1.0 + OCCUPANCY_SLACK
            and cpus <= len(self._idle_cpus)
            and gpus <= len(self._idle_gpus)
        )

    def assign(self, job_id: str, cpus: int, gpus: int, occupancy: float) -> NodePlacement:
        """Give the job the lowest idle cpu and gpu ids; raise if it does not fit."""
        if job_id in self._holdings:
            raise InsufficientResources(f"{self.hostname}: job {job_id} is already assigned")
        if cpus < 0 or gpus < 0 or not 0.0 < occupancy <= 1.0:
            raise InsufficientResources(
                f"{self.hostname}: cannot assign cpus={cpus} gpus={gpus} occupancy={occupancy}"
            )
        if not self.fits(cpus, gpus, occupancy):
            raise InsufficientResources(
                f"{self.hostname}: job {job_id} needs cpus={cpus} gpus={gpus} "
                f"occupancy={occupancy:.3f}; idle cpus={len(self._idle_cpus)} "
                f"gpus={len(self._idle_gpus)} occupancy={self.occupancy:.3f}"
            )
        placement = NodePlacement(
            self.hostname, tuple(self._idle_cpus[:cpus]), tuple(self._idle_gpus[:gpus])
        )
        del self._idle_cpus[:cpus]
        del self._idle_gpus[:gpus]
        self._holdings[job_id] = (placement, occupancy)
        self.occupancy += occupancy
        return placement

    def release(self, job_id: str) -> NodePlacement:
        """Free what the job held here and return it; raise ``UnknownJob`` if it held nothing."""
        try:
            placement, _ = self._holdings.pop(job_id)
        except KeyError:
            raise UnknownJob(f"{self.hostname}: job {job_id} holds nothing here") from None
        if placement.cpu_ids:
            self._idle_cpus.extend(placement.cpu_ids)
            self._idle_cpus.sort()
        if placement.gpu_ids:
            self._idle_gpus.extend(placement.gpu_ids)
            self._idle_gpus.sort(key=self._gpu_order.__getitem__)
        # Re-summing (instead of subtracting) keeps float drift from accumulating over a
        # launcher's lifetime of thousands of assign/release cycles.
        self.occupancy = math.fsum(occ for _, occ in self._holdings.values())
        return placement

    def __repr__(self) -> str:
        return (
            f"ComputeNode({self.hostname!r}, occupancy={self.occupancy:.3f}, "
            f"idle_cpus={len(self._idle_cpus)}/{len(self.spec.cpu_ids)}, "
            f"idle_gpus={len(self._idle_gpus)}/{len(self.spec.gpu_ids)}, "
            f"jobs={len(self._holdings)})"
        )
