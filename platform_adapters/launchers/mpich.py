"""``mpiexec`` of MPICH's Hydra process manager.

For 2 nodes, 4 ranks per node, 4 cores per rank: ``mpiexec -n 8 -ppn 4 -hosts a,b -bind-to
core:4``. With ``cpu_bind: placement`` each rank is bound to the cores the pilot placed the job
on: ``-bind-to user:0+1+2+3,4+5+6+7,...`` (one ``+``-joined CPU set per local rank). Hydra
passes its whole environment to the ranks by default, so nothing is forwarded explicitly.
"""

from __future__ import annotations

from lodestream.platform_adapters.launchers.base import TaskSpec
from lodestream.platform_adapters.launchers.layout import RankLayout, rank_cpu_sets
from lodestream.platform_adapters.launchers.mpi import MpiLauncher
from lodestream.platform_adapters.launchers.options import Option, OptionStyle


class MpichLauncher(MpiLauncher):
    """MPICH's Hydra process manager (``mpiexec``/``mpiexec.hydra``)."""

    name = "mpich"
    default_executable = "mpiexec"
    style = OptionStyle(
        joins_long=False,
        aliases={"np": "n", "host": "hosts", "l": "prepend-rank", "binding": "bind-to"},
        allowed=frozenset({
            "bind-to", "map-by", "membind", "ppn", "iface", "verbose", "prepend-rank",
            "disable-auto-cleanup", "demux",
        }),
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
