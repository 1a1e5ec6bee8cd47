"""``jsrun`` of IBM's CSM/LSF (Summit and other CORAL systems).

One resource set per rank: for 2 nodes, 4 ranks per node, 7 cores and 1 GPU per rank,
``jsrun -n 8 -r 4 -a 1 -c 7 -g 1 -b packed:7``. jsrun takes no host list: it places resource
sets anywhere in the allocation that is free, and keeps concurrent jsruns apart itself
(``placement`` binds like ``auto``); the pilot's bookkeeping sees to it that there is room.
jsrun passes its environment to the ranks.
"""

from __future__ import annotations

from lodestream.platform_adapters.launchers.base import TaskSpec
from lodestream.platform_adapters.launchers.layout import RankLayout
from lodestream.platform_adapters.launchers.mpi import MpiLauncher
from lodestream.platform_adapters.launchers.options import Arity, Option, OptionStyle


class JsrunLauncher(MpiLauncher):
    name = "jsrun"
    default_executable = "jsrun"
    style = OptionStyle(
        joins_long=True,
        aliases={
            "n": "nrs", "a": "tasks_per_rs", "c": "cpu_per_rs", "g": "gpu_per_rs",
            "r": "rs_per_host", "b": "bind", "d": "launch_distribution", "l": "latency_priority",
            "E": "env", "p": "np",
        },
        allowed={
            "bind": Arity.VALUE, "launch_distribution": Arity.VALUE,
            "latency_priority": Arity.VALUE, "rs_per_socket": Arity.VALUE,
        },
    )  # fmt: skip

    def render_options(self, spec: TaskSpec, layout: RankLayout) -> list[Option]:
        bind = "none" if self.cpu_bind == "none" else f"packed:{layout.cores_per_rank}"
        return [
            self.option("-n", layout.num_ranks),
            self.option("-r", layout.ranks_per_node),
            self.option("-a", 1),
            self.option("-c", layout.cores_per_rank),
            self.option("-g", layout.gpus_per_rank),
            self.option("-b", bind),
        ]
