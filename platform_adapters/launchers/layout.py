"""How a task's ranks sit on its nodes: counts every launcher needs, and per-rank CPU lists.

The packer gives a job ``ceil(threads_per_rank / threads_per_core)`` cores per rank on each of
its nodes (Balsam's rule); ``threads_per_core`` of the job is how many of its threads share a
core, capped here by the hardware threads the machine's cores have. Launchers count differently:

* ``cores_per_rank``: physical cores (Hydra ``core:N``, Open MPI ``PE=N``, jsrun ``-c``,
  flux ``-c``);
* ``cpus_per_rank``: logical CPUs (hardware threads) a rank uses, ``cores_per_rank *
  threads_per_core`` (PALS ``--depth``, aprun ``-d``, srun ``--cpus-per-task``, which
  renders ``--threads-per-core`` beside it so that the count means the same on every site).

``rank_cpu_sets`` binds ranks to the very cores the pilot placed the job on (cpu_bind
``placement``): without it, two jobs packed on one node would both be bound from core 0 up.
"""

from __future__ import annotations

from dataclasses import dataclass

from lodestream.platform_adapters.compute.machine import Machine
from lodestream.platform_adapters.launchers.base import TaskSpec


@dataclass(frozen=True, slots=True)
class RankLayout:
    num_nodes: int
    ranks_per_node: int
    cores_per_rank: int
    threads_per_core: int  # hardware threads of each core a rank uses
    gpus_per_rank: int

    @property
    def num_ranks(self) -> int:
        return self.num_nodes * self.ranks_per_node

    @property
    def cpus_per_rank(self) -> int:
        return self.cores_per_rank * self.threads_per_core

    @classmethod
    def of(cls, spec: TaskSpec, machine: Machine) -> RankLayout:
        return cls(
            num_nodes=spec.allocation.num_nodes,
            ranks_per_node=spec.ranks_per_node,
            cores_per_rank=-(-spec.threads_per_rank // spec.threads_per_core),
            threads_per_core=max(1, min(spec.threads_per_core, machine.node.threads_per_core)),
            gpus_per_rank=spec.gpus_per_rank,
        )


def rank_cpu_sets(spec: TaskSpec, machine: Machine) -> list[tuple[int, ...]] | None:
    """The logical CPUs of each local rank, from the job's placement; the same on every node.

    None when the placement cannot say: the nodes were given different core ids, or fewer
    cores than the ranks need (a local machine's accounting slots).
    """
    placements = spec.allocation.placements
    if not placements:
        return None
    cores = placements[0].cpu_ids
    if any(p.cpu_ids != cores for p in placements[1:]):
        return None
    layout = RankLayout.of(spec, machine)
    if layout.ranks_per_node * layout.cores_per_rank > len(cores):
        return None
    sets: list[tuple[int, ...]] = []
    for rank in range(layout.ranks_per_node):
        mine = cores[rank * layout.cores_per_rank : (rank + 1) * layout.cores_per_rank]
        cpus = [
            cpu for core in mine for cpu in machine.node.logical_cpus(core, layout.threads_per_core)
        ]
        sets.append(tuple(sorted(cpus)))
    return sets
