"""Which rank of an mpi4py serial pilot serves which node, and what its jobs inherit. Pure.

A pilot started as ``mpiexec -n <nodes> -ppn 1 python -m lodestream.agents.launcher.mpi_worker``
has one rank per node. Rank 0 leases and reports; every rank, rank 0 included, runs the jobs
packed on the one node it serves. :func:`assign_nodes` pairs the nodes of the allocation with
the ranks by host name:

* a node is served by a rank running on it (names compared without their domain and case);
  worker ranks are chosen before rank 0, so a rank 0 started as an extra rank beside a worker
  (``mpiexec -n <nodes + 1>``) only leases;
* the local machine's virtual nodes are all on rank 0's host, so they go to the ranks on that
  host in order (how the tests and ``bench.mpi_serial`` run several workers on one machine);
* a node whose name no rank reports (the scheduler and the node disagree on names) gets a rank
  whose host no node names, in order, and is listed in ``renamed`` for the log;
* a node left without a rank is not served (its jobs go elsewhere), and a rank left without a
  node exits at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

# Set by process managers for one rank of the pilot: a job that inherited them would believe
# it is that rank of the pilot's own MPI job (and an mpi4py job would join it, or hang).
RANK_VARIABLE_PREFIXES: Final = (
    "PMI_", "PMIX_", "HYDI_", "HYDRA_CONTROL", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
    "OMPI_COMM_WORLD_", "OMPI_MCA_ess", "OMPI_MCA_orte_", "OMPI_MCA_pmix", "PALS_RANKID",
    "PALS_NODEID", "PALS_LOCAL_", "PALS_APID", "PALS_SPOOL_DIR", "SLURM_PROCID", "SLURM_LOCALID",
    "SLURM_NODEID", "SLURM_STEP_", "SLURM_STEPID", "SLURM_TASK_PID", "SLURM_SRUN_COMM_",
    "SLURM_LAUNCH_NODE_IPADDR", "SLURM_DISTRIBUTION", "SLURM_CPU_BIND", "ALPS_APP_",
    "FLUX_TASK_", "JSM_NAMESPACE_",
)  # fmt: skip


def job_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` less what makes a process one rank of the pilot's MPI job.

    The batch job's own variables (``SLURM_JOB_ID``, ``SLURM_NTASKS``, ``PBS_NODEFILE``, ...)
    stay: jobs and the MPI launchers they start read them.
    """
    return {k: v for k, v in environ.items() if not k.startswith(RANK_VARIABLE_PREFIXES)}


@dataclass(frozen=True, slots=True)
class Assignment:
    """``rank_of``: node index → the rank that serves it; the rest for the log."""

    rank_of: Mapping[int, int]
    renamed: tuple[int, ...] = ()  # nodes served by a rank whose host has another name
    unserved: tuple[int, ...] = ()  # nodes no rank serves
    idle: tuple[int, ...] = ()  # ranks that serve no node (they exit; rank 0 only leases)

    def node_of(self, rank: int) -> int | None:
        for node, served_by in self.rank_of.items():
            if served_by == rank:
                return node
        return None


def short_host(name: str) -> str:
    return name.split(".", 1)[0].lower()


def assign_nodes(node_hosts: Sequence[str], rank_hosts: Sequence[str]) -> Assignment:
    """Pair nodes (by the host each is on) with ranks (by the host each runs on); see above."""
    free = [*range(1, len(rank_hosts)), *range(min(1, len(rank_hosts)))]  # workers, then 0
    rank_of: dict[int, int] = {}
    for node, host in enumerate(node_hosts):
        wanted = short_host(host)
        match = next((r for r in free if short_host(rank_hosts[r]) == wanted), None)
        if match is not None:
            rank_of[node] = match
            free.remove(match)
    named = {short_host(h) for h in node_hosts}
    strangers = [r for r in free if short_host(rank_hosts[r]) not in named]
    renamed: list[int] = []
    for node in range(len(node_hosts)):
        if node not in rank_of and strangers:
            rank_of[node] = strangers.pop(0)
            renamed.append(node)
    served = set(rank_of.values())
    return Assignment(
        rank_of=rank_of,
        renamed=tuple(renamed),
        unserved=tuple(n for n in range(len(node_hosts)) if n not in rank_of),
        idle=tuple(r for r in range(len(rank_hosts)) if r not in served),
    )
