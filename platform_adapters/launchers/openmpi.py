"""``mpiexec`` of Open MPI (ORTE in 4.x, PRRTE in 5.x).

For 2 nodes, 4 ranks per node, 4 cores per rank: ``mpiexec -np 8 --host a:4,b:4 --map-by
ppr:4:node:PE=4 --bind-to core -x OMP_NUM_THREADS -x LODE_JOB_ID ...``. Ranks on other nodes
get only the variables named with ``-x``, so every variable lodestream sets is named (by name:
the values are in the launcher's environment). There is no placement binding (it would need a
rankfile); ``placement`` binds like ``auto``.
"""

from __future__ import annotations

from lodestream.platform_adapters.launchers.base import TaskSpec, launch_env
from lodestream.platform_adapters.launchers.layout import RankLayout
from lodestream.platform_adapters.launchers.mpi import MpiLauncher
from lodestream.platform_adapters.launchers.options import Arity, Option, OptionStyle


class OpenMpiLauncher(MpiLauncher):
    """Open MPI's ``mpiexec`` (ORTE in 4.x, PRRTE in 5.x)."""

    name = "openmpi"
    default_executable = "mpiexec"
    style = OptionStyle(
        joins_long=False,
        aliases={"n": "np", "H": "host", "c": "np"},
        allowed={
            "map-by": Arity.VALUE, "bind-to": Arity.VALUE, "rank-by": Arity.VALUE,
            "oversubscribe": Arity.SWITCH, "nooversubscribe": Arity.SWITCH,
            "report-bindings": Arity.SWITCH, "display-map": Arity.SWITCH,
            "use-hwthread-cpus": Arity.SWITCH, "tag-output": Arity.SWITCH,
            "timestamp-output": Arity.SWITCH, "cpu-set": Arity.VALUE,
        },
        repeatable=frozenset({"x"}),
    )  # fmt: skip

    def render_options(self, spec: TaskSpec, layout: RankLayout) -> list[Option]:
        per_node = layout.ranks_per_node
        hosts = ",".join(f"{host}:{per_node}" for host in spec.hostnames)
        options = [self.option("-np", layout.num_ranks), self.option("--host", hosts)]
        if self.cpu_bind == "none":
            options += [
                self.option("--map-by", f"ppr:{per_node}:node"),
                self.option("--bind-to", "none"),
            ]
        else:
            options += [
                self.option("--map-by", f"ppr:{per_node}:node:PE={layout.cores_per_rank}"),
                self.option("--bind-to", "core"),
            ]
        options += [self.option("-x", name) for name in launch_env(spec, self.machine.gpu_env)]
        return options
