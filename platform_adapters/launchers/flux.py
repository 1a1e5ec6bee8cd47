"""``flux run`` inside the pilot's Flux instance.

For 2 nodes, 4 ranks per node, 4 cores and 1 GPU per rank: ``flux run -N 2 -n 8 -c 4 -g 1
--requires=host:a,b -o cpu-affinity=per-task -o gpu-affinity=per-task``. Flux spreads the
tasks evenly over the nodes, binds each to the cores (and GPUs) it picks for it within the
named hosts (``placement`` binds like ``auto``), and sets the GPU visibility variable of each
task itself. ``flux run`` passes its environment to the tasks.
"""

from __future__ import annotations

from lodestream.platform_adapters.launchers.base import TaskSpec
from lodestream.platform_adapters.launchers.layout import RankLayout
from lodestream.platform_adapters.launchers.mpi import MpiLauncher
from lodestream.platform_adapters.launchers.options import Arity, Option, OptionStyle


class FluxLauncher(MpiLauncher):
    name = "flux"
    default_executable = "flux"
    style = OptionStyle(
        joins_long=True,
        aliases={
            "N": "nodes", "n": "ntasks", "c": "cores-per-task", "g": "gpus-per-task",
            "x": "exclusive", "l": "label-io", "u": "unbuffered", "t": "time-limit",
            "o": "setopt",
        },
        allowed={
            "setopt:cpu-affinity": Arity.VALUE, "setopt:gpu-affinity": Arity.VALUE,
            "setopt:verbose": Arity.VALUE, "setopt:mpi": Arity.VALUE, "setopt:pmi": Arity.VALUE,
            "setopt:exit-timeout": Arity.VALUE, "setopt:exit-on-error": Arity.VALUE,
            "exclusive": Arity.SWITCH, "label-io": Arity.SWITCH, "unbuffered": Arity.SWITCH,
            "time-limit": Arity.VALUE,
        },
        repeatable=frozenset({"setopt"}),
    )  # fmt: skip

    def render_command(self, spec: TaskSpec) -> list[str]:
        command = super().render_command(spec)
        return [command[0], "run", *command[1:]]

    def render_options(self, spec: TaskSpec, layout: RankLayout) -> list[Option]:
        options = [
            self.option("-N", layout.num_nodes),
            self.option("-n", layout.num_ranks),
            self.option("-c", layout.cores_per_rank),
        ]
        if layout.gpus_per_rank:
            options.append(self.option("-g", layout.gpus_per_rank))
        affinity = "off" if self.cpu_bind == "none" else "per-task"
        options += [
            self.option("--requires", "host:" + ",".join(spec.hostnames)),
            self.option("-o", f"cpu-affinity={affinity}"),
        ]
        if layout.gpus_per_rank:
            options.append(self.option("-o", "gpu-affinity=per-task"))
        return options
