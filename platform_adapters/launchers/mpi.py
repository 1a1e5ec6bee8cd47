"""What the MPI launchers (mpiexec of MPICH, PALS and Open MPI; srun, aprun, jsrun, flux run)
share: a command line ``<launcher> <options> bash -c <script>`` started and managed like a
local task.

A backend only renders its options from the task's ``RankLayout`` (``render_options``). The
base adds the job's ``launch_params`` (see ``options``), runs the job's script with bash on
every rank, and sets the machine's GPU visibility variable and ``OMP_NUM_THREADS`` in the
launcher's environment, which every launcher here forwards to its ranks (Open MPI is told
which variables with ``-x``).

The launcher's executable is found on the task's PATH (then the pilot's) when a task starts;
``render_command`` shows it by name. ``check_available`` tells the pilot at start whether it is
there at all.

The task's process is the launcher, so its exit status is the launcher's: the worst rank's
status as the launcher reports it, and, after ``terminate``, whatever the launcher exits with
once it has passed SIGTERM on to the ranks (Hydra: 15), rather than ``-SIGTERM``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from abc import abstractmethod
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import ClassVar

from lodestream.platform_adapters.compute.machine import (
    DEFAULT_MACHINE,
    CpuBind,
    Machine,
    load_machine,
)
from lodestream.platform_adapters.errors import LauncherUnavailable, StartFailed
from lodestream.platform_adapters.launchers.base import TaskSpec, render_env
from lodestream.platform_adapters.launchers.layout import RankLayout
from lodestream.platform_adapters.launchers.options import (
    Arity,
    Option,
    OptionStyle,
    with_launch_params,
)
from lodestream.platform_adapters.launchers.process import SubprocessLauncher
from lodestream.platform_adapters.packing import Allocation


class MpiLauncher(SubprocessLauncher):
    """Base of the launchers that start ranks on the nodes of the task's allocation."""

    default_executable: ClassVar[str]
    style: ClassVar[OptionStyle]
    # The name the launcher is given for a node the pilot knows by another: the local
    # machine's virtual nodes (``host-v0``, ``host-v1``) are all ``localhost`` to mpiexec.
    # Only the command line changes; the job sees the pilot's node names.
    host_aliases: Mapping[str, str] = MappingProxyType({})

    def __init__(
        self,
        machine: Machine | None = None,
        *,
        executable: str | None = None,
        bash: str | None = None,
        cpu_bind: CpuBind | None = None,
        allow_options: Mapping[str, Arity] | None = None,
    ) -> None:
        """``machine`` gives CPU numbering, the GPU variable and the default ``cpu_bind``;
        ``allow_options`` are further options (names without dashes) jobs may pass, with
        how each is read (a switch, or an option that takes a value)."""
        self.machine = machine if machine is not None else load_machine(DEFAULT_MACHINE)
        self.executable = executable or self.default_executable
        # Ranks run on compute nodes of the same image as the pilot's; an absolute path keeps
        # them independent of the PATH a task's environment brings.
        self.bash = bash or shutil.which("bash") or "/bin/bash"
        self.cpu_bind: CpuBind = cpu_bind or self.machine.cpu_bind
        self.allow_options = dict(allow_options or {})

    def render_command(self, spec: TaskSpec) -> list[str]:
        spec = self._aliased(spec)
        layout = RankLayout.of(spec, self.machine)
        options = self.render_options(spec, layout)
        words = with_launch_params(options, spec.launch_params, self.style, self.allow_options)
        return [self.executable, *words, *self.program(spec)]

    @abstractmethod
    def render_options(self, spec: TaskSpec, layout: RankLayout) -> list[Option]:
        """The launcher's own options for this task, before the job's ``launch_params``."""

    def program(self, spec: TaskSpec) -> list[str]:
        """What each rank runs: the job's script, one argv word, never re-parsed by a shell."""
        return [self.bash, "-c", spec.script]

    def task_env(self, spec: TaskSpec) -> dict[str, str]:
        return render_env(spec, self.machine.gpu_env)

    def argv_for(self, spec: TaskSpec, env: dict[str, str]) -> list[str]:
        argv = self.render_command(spec)
        found = self.which(env.get("PATH")) or self.which(os.environ.get("PATH"))
        if found is None:
            raise StartFailed(f"job {spec.job_id}: could not start: {self._missing()}")
        return [found, *argv[1:]]

    def check_available(self) -> None:
        if self.which(os.environ.get("PATH")) is None:
            raise LauncherUnavailable(self._missing())

    def which(self, path: str | None) -> str | None:
        found = shutil.which(self.executable, path=path)
        return str(Path(found).absolute()) if found is not None else None

    def _aliased(self, spec: TaskSpec) -> TaskSpec:
        if not self.host_aliases:
            return spec
        placements = tuple(
            dataclasses.replace(p, hostname=self.host_aliases.get(p.hostname, p.hostname))
            for p in spec.allocation.placements
        )
        return dataclasses.replace(spec, allocation=Allocation(spec.job_id, placements))

    def option(self, flag: str, value: str | int | None = None) -> Option:
        return self.style.option(flag, None if value is None else str(value))

    def _missing(self) -> str:
        return (
            f"app launcher {self.name!r} needs {self.executable!r}, which is not on PATH "
            "(load the module that provides it, or choose another app_launcher)"
        )
