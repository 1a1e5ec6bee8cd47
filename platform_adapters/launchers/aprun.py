"""``aprun`` of Cray ALPS (Theta and other XC systems).

For 2 nodes, 4 ranks per node, 8 threads per rank with 2 hardware threads of each core used:
``aprun -n 8 -N 4 -d 8 -j 2 -cc depth -L 3830,3831``. ``-d`` counts CPUs per rank, of which
``-j`` are taken from each core. ``-L`` takes node numbers, so it is rendered only when every
hostname is a ``nid`` name (``nid03830``); ALPS otherwise places the ranks within the job's
reservation. ALPS gives whole nodes to one aprun at a time, so there is no placement binding
(``placement`` binds like ``auto``). aprun passes its environment to the ranks.
"""

from __future__ import annotations

import re

from lodestream.platform_adapters.launchers.base import TaskSpec
from lodestream.platform_adapters.launchers.layout import RankLayout
from lodestream.platform_adapters.launchers.mpi import MpiLauncher
from lodestream.platform_adapters.launchers.options import Arity, Option, OptionStyle

_NID = re.compile(r"nid0*(\d+)")


class AprunLauncher(MpiLauncher):
    name = "aprun"
    default_executable = "aprun"
    style = OptionStyle(
        joins_long=False,
        aliases={"cpu-binding": "cc", "cpus-per-pe": "d", "cpus-per-cu": "j"},
        allowed={
            "cc": Arity.VALUE,
            "d": Arity.VALUE,
            "j": Arity.VALUE,
            "S": Arity.VALUE,
            "sl": Arity.VALUE,
            "sn": Arity.VALUE,
            "ss": Arity.SWITCH,
            "r": Arity.VALUE,
            "q": Arity.SWITCH,
            "b": Arity.SWITCH,
            "m": Arity.VALUE,
            "T": Arity.SWITCH,
        },
    )

    def render_options(self, spec: TaskSpec, layout: RankLayout) -> list[Option]:
        options = [
            self.option("-n", layout.num_ranks),
            self.option("-N", layout.ranks_per_node),
            self.option("-d", layout.cpus_per_rank),
            self.option("-j", layout.threads_per_core),
            self.option("-cc", "none" if self.cpu_bind == "none" else "depth"),
        ]
        nids = [_NID.fullmatch(host) for host in spec.hostnames]
        if all(nids):
            options.append(self.option("-L", ",".join(m[1] for m in nids if m)))
        return options
