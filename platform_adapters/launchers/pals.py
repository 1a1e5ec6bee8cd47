"""``mpiexec`` of HPE Cray PALS (ALCF Polaris and Aurora).

For 2 nodes, 4 ranks per node, 8 CPUs (hardware threads) per rank: ``mpiexec -n 8 --ppn 4
--hosts a,b --depth 8 --cpu-bind depth``. With ``cpu_bind: placement`` (the default of the
Polaris and Aurora descriptions) each rank gets the CPUs of the cores the pilot placed the job
on, siblings included: ``--cpu-bind list:0-3,32-35:4-7,36-39``. PALS passes its environment to
the ranks.
"""

from __future__ import annotations

from lodestream.platform_adapters.compute.hostlist import format_ids
from lodestream.platform_adapters.launchers.base import TaskSpec
from lodestream.platform_adapters.launchers.layout import RankLayout, rank_cpu_sets
from lodestream.platform_adapters.launchers.mpi import MpiLauncher
from lodestream.platform_adapters.launchers.options import Arity, Option, OptionStyle


class PalsLauncher(MpiLauncher):
    """HPE Cray PALS ``mpiexec`` (ALCF Polaris and Aurora)."""

    name = "pals"
    default_executable = "mpiexec"
    style = OptionStyle(
        joins_long=False,
        aliases={"np": "n", "d": "depth", "l": "label", "host": "hosts"},
        allowed={
            "cpu-bind": Arity.VALUE, "depth": Arity.VALUE, "ppn": Arity.VALUE,
            "mem-bind": Arity.VALUE, "label": Arity.SWITCH, "line-buffer": Arity.SWITCH,
            "verbose": Arity.SWITCH, "pmi": Arity.VALUE,
        },
    )  # fmt: skip

    def render_options(self, spec: TaskSpec, layout: RankLayout) -> list[Option]:
        options = [
            self.option("-n", layout.num_ranks),
            self.option("--ppn", layout.ranks_per_node),
            self.option("--hosts", ",".join(spec.hostnames)),
        ]
        sets = rank_cpu_sets(spec, self.machine) if self.cpu_bind == "placement" else None
        if self.cpu_bind == "none":
            options.append(self.option("--cpu-bind", "none"))
        elif sets is not None:
            lists = ":".join(format_ids(cpus) for cpus in sets)
            options.append(self.option("--cpu-bind", f"list:{lists}"))
        else:
            options += [
                self.option("--depth", layout.cpus_per_rank),
                self.option("--cpu-bind", "depth"),
            ]
        return options
