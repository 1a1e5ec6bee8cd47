"""``srun`` inside the pilot's Slurm allocation.

For 2 nodes, 4 ranks per node, 4 cores per rank, 1 GPU per rank on nodes with 2 hardware
threads per core: ``srun --nodes=2 --ntasks=8 --ntasks-per-node=4 --cpus-per-task=4
--threads-per-core=1 --gpus-per-task=1 --nodelist=a,b --cpu-bind=cores --exact``.

``--cpus-per-task`` counts Slurm CPUs, which are hardware threads on nodes that have several;
``--threads-per-core`` (rendered on such machines) makes the count mean the same whatever the
site's defaults. ``--exact`` gives each step only what it asks for, so the pilot's concurrent
steps share the nodes instead of waiting for each other; ``overlap=True`` renders ``--overlap``
instead, for a pilot that itself runs as a step holding the whole allocation. Slurm places the
tasks of a step on CPUs and GPUs it picks within that step (``placement`` binds like
``auto``), and sets the GPU visibility variable of each task itself when GPUs are requested.
srun passes its whole environment to the tasks.
"""

from __future__ import annotations

from collections.abc import Mapping

from lodestream.platform_adapters.compute.machine import CpuBind, Machine
from lodestream.platform_adapters.launchers.base import TaskSpec
from lodestream.platform_adapters.launchers.layout import RankLayout
from lodestream.platform_adapters.launchers.mpi import MpiLauncher
from lodestream.platform_adapters.launchers.options import Arity, Option, OptionStyle


class SrunLauncher(MpiLauncher):
    name = "srun"
    default_executable = "srun"
    style = OptionStyle(
        joins_long=True,
        aliases={
            "N": "nodes", "n": "ntasks", "c": "cpus-per-task", "w": "nodelist",
            "m": "distribution", "l": "label", "u": "unbuffered", "K": "kill-on-bad-exit",
            "W": "wait", "O": "overcommit", "G": "gpus", "cpu_bind": "cpu-bind",
            "mem_bind": "mem-bind",
        },
        allowed={
            "cpu-bind": Arity.VALUE, "mem-bind": Arity.VALUE, "mpi": Arity.VALUE,
            "distribution": Arity.VALUE, "gpu-bind": Arity.VALUE, "gpus-per-task": Arity.VALUE,
            "gpus-per-node": Arity.VALUE, "ntasks-per-gpu": Arity.VALUE,
            "cpus-per-gpu": Arity.VALUE, "overlap": Arity.SWITCH, "exact": Arity.SWITCH,
            "exclusive": Arity.OPTIONAL, "hint": Arity.VALUE, "threads-per-core": Arity.VALUE,
            "ntasks-per-socket": Arity.VALUE, "ntasks-per-core": Arity.VALUE, "mem": Arity.VALUE,
            "mem-per-cpu": Arity.VALUE, "mem-per-gpu": Arity.VALUE, "network": Arity.VALUE,
            "cpu-freq": Arity.VALUE, "label": Arity.SWITCH, "unbuffered": Arity.SWITCH,
            "kill-on-bad-exit": Arity.OPTIONAL, "wait": Arity.VALUE, "gres-flags": Arity.VALUE,
            "cpus-per-task": Arity.VALUE, "switches": Arity.VALUE, "overcommit": Arity.SWITCH,
        },
    )  # fmt: skip

    def __init__(
        self,
        machine: Machine | None = None,
        *,
        executable: str | None = None,
        bash: str | None = None,
        cpu_bind: CpuBind | None = None,
        allow_options: Mapping[str, Arity] | None = None,
        overlap: bool = False,
        mpi: str | None = None,
    ) -> None:
        """``overlap``: share the resources of a step that holds the allocation; ``mpi``: the
        ``--mpi`` plugin (``pmi2``, ``pmix``) when the site's default is not the one."""
        super().__init__(
            machine, executable=executable, bash=bash, cpu_bind=cpu_bind,
            allow_options=allow_options,
        )  # fmt: skip
        self.overlap = overlap
        self.mpi = mpi

    def render_options(self, spec: TaskSpec, layout: RankLayout) -> list[Option]:
        options = [
            self.option("--nodes", layout.num_nodes),
            self.option("--ntasks", layout.num_ranks),
            self.option("--ntasks-per-node", layout.ranks_per_node),
            self.option("--cpus-per-task", layout.cpus_per_rank),
        ]
        if self.machine.node.threads_per_core > 1:
            options.append(self.option("--threads-per-core", layout.threads_per_core))
        if layout.gpus_per_rank:
            options.append(self.option("--gpus-per-task", layout.gpus_per_rank))
        options += [
            self.option("--nodelist", ",".join(spec.hostnames)),
            self.option("--cpu-bind", "none" if self.cpu_bind == "none" else "cores"),
            self.option("--overlap" if self.overlap else "--exact"),
        ]
        if self.mpi:
            options.append(self.option("--mpi", self.mpi))
        return options
