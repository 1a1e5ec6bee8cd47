"""``mpiexec`` of MPICH's Hydra process manager.

For 2 nodes, 4 ranks per node, 4 cores per rank: ``mpiexec -n 8 -ppn 4 -hosts a,b -bind-to
core:4``. With ``cpu_bind: placement`` each rank is bound to the cores the pilot placed the job
on: ``-bind-to user:0+1+2+3,4+5+6+7,...`` (one ``+``-joined CPU set per local rank). Hydra
passes its whole environment to the ranks by default, so nothing is forwarded explicitly.

Inside a Slurm allocation Hydra starts its proxies with ``srun``: one job step per job. A step
waits for CPUs (and GPUs) that other steps hold, and by default it asks for all of its nodes',
so two jobs the pilot packed on one node would run one after the other, the second "started"
while it waits. The pilot places its jobs itself, so their steps are told to share the
allocation: ``--overlap`` is added to ``HYDRA_LAUNCHER_EXTRA_ARGS`` (Slurm 20.11 or later)
whenever Hydra will launch with srun.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from lodestream.platform_adapters.launchers.base import TaskSpec
from lodestream.platform_adapters.launchers.layout import RankLayout, rank_cpu_sets
from lodestream.platform_adapters.launchers.mpi import MpiLauncher
from lodestream.platform_adapters.launchers.options import Arity, Option, OptionStyle

EXTRA_ARGS: Final = "HYDRA_LAUNCHER_EXTRA_ARGS"  # words Hydra adds to its launcher's command
OVERLAP: Final = "--overlap"
# What Hydra takes as a Slurm allocation (MPICH's slurm_query_native_int.c): one of each.
_SLURM_ALLOCATION: Final = (
    ("SLURM_JOB_NODELIST", "SLURM_NODELIST"),
    ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"),
    ("SLURM_TASKS_PER_NODE",),
)


def hydra_launches_with_srun(env: Mapping[str, str]) -> bool:
    """Whether Hydra, run with ``env``, starts its proxies with ``srun``.

    As MPICH's ``bsci_init.c`` decides: the launcher named by ``HYDRA_LAUNCHER`` (or the older
    ``HYDRA_BOOTSTRAP``); else the resource manager's own, ``HYDRA_RMK`` or the one detected,
    which is Slurm where the allocation's variables are set.
    """
    for name in ("HYDRA_LAUNCHER", "HYDRA_BOOTSTRAP"):
        if name in env:
            return env[name] == "slurm"
    if "HYDRA_RMK" in env:
        return env["HYDRA_RMK"] == "slurm"
    return all(any(name in env for name in names) for names in _SLURM_ALLOCATION)


class MpichLauncher(MpiLauncher):
    """MPICH's Hydra process manager (``mpiexec``/``mpiexec.hydra``)."""

    name = "mpich"
    default_executable = "mpiexec"
    style = OptionStyle(
        joins_long=False,
        aliases={"np": "n", "host": "hosts", "l": "prepend-rank", "binding": "bind-to"},
        allowed={
            "bind-to": Arity.VALUE, "map-by": Arity.VALUE, "membind": Arity.VALUE,
            "ppn": Arity.VALUE, "iface": Arity.VALUE, "verbose": Arity.SWITCH,
            "prepend-rank": Arity.SWITCH, "disable-auto-cleanup": Arity.SWITCH,
            "demux": Arity.VALUE,
        },
    )  # fmt: skip

    def render_options(self, spec: TaskSpec, layout: RankLayout) -> list[Option]:
        options = [
            self.option("-n", layout.num_ranks),
            self.option("-ppn", layout.ranks_per_node),
            self.option("-hosts", ",".join(spec.hostnames)),
        ]
        sets = rank_cpu_sets(spec, self.machine) if self.cpu_bind == "placement" else None
        if self.cpu_bind == "none":
            options.append(self.option("-bind-to", "none"))
        elif sets is not None:
            user = ",".join("+".join(str(cpu) for cpu in cpus) for cpus in sets)
            options.append(self.option("-bind-to", f"user:{user}"))
        else:
            options.append(self.option("-bind-to", f"core:{layout.cores_per_rank}"))
        return options

    def task_env(self, spec: TaskSpec) -> dict[str, str]:
        env = super().task_env(spec)
        if hydra_launches_with_srun(env):
            extra = env.get(EXTRA_ARGS, "").split()
            if OVERLAP not in extra:
                env[EXTRA_ARGS] = " ".join([OVERLAP, *extra])
        return env
