"""Local app launcher: runs the job's script with ``bash -c`` on this host, or its words directly.

Like Balsam's local app run, the script runs once whatever ``ranks_per_node`` says (MPI ranks
are the business of the mpiexec/srun backends), and tasks are not pinned to their cpu ids: the
ids are bookkeeping that keeps packing honest. When the site gives the job's words
(``TaskSpec.argv``) and the program is a file we can find, they are executed without bash,
which saves bash's start-up (about 1 ms of CPU, most of a short task's cost); a program that is
not found is left to bash, so the job fails as it would have, with bash's message and status
127. Bash (5.1+) execs the last command of a ``-c`` script, so with a site-rendered script the
group leader is normally the app itself and gets the whole grace period of ``terminate`` to
checkpoint. Process handling is ``process.SubprocessLauncher``'s.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from lodestream.platform_adapters.errors import InvalidLaunchParams
from lodestream.platform_adapters.launchers.base import CUDA_VISIBLE_DEVICES, TaskSpec, render_env
from lodestream.platform_adapters.launchers.process import ProcessTask, SubprocessLauncher, popen

# The local backend's task is a plain process task; the name stays for callers that use it.
LocalTask = ProcessTask


def render_command(spec: TaskSpec, bash: str = "/bin/bash") -> list[str]:
    """``bash -c <script>``: the script travels as one argv entry, never re-parsed by a shell."""
    return [bash, "-c", spec.script]


def refuse_launch_params(spec: TaskSpec, launcher: str) -> None:
    """``InvalidLaunchParams`` for a job that gives launch_params to a launcher with no options:
    a job that asked for a binding or an MPI plugin must not run as if it had it."""
    if spec.launch_params:
        raise InvalidLaunchParams(
            f"launch_params: the {launcher} app launcher takes no options "
            f"(given: {', '.join(sorted(spec.launch_params))}); this site's pilots run jobs "
            "without an MPI launcher"
        )


def direct_command(spec: TaskSpec, env: Mapping[str, str]) -> list[str] | None:
    """``spec.argv`` with its program resolved as bash would, on ``env``'s PATH, or None.

    ``env`` is the task's whole environment, ``argv_env`` included.
    """
    if not spec.argv:
        return None
    program = spec.argv[0]
    if "/" in program:
        resolved = spec.workdir / program  # a relative path is the workdir's, as after `cd`
        if not os.access(resolved, os.X_OK) or resolved.is_dir():
            return None
        return [str(resolved), *spec.argv[1:]]
    path = env.get("PATH", os.defpath)
    found = shutil.which(program, path=path)
    if found is None or not Path(found).is_absolute():
        return None
    return [found, *spec.argv[1:]]


class LocalLauncher(SubprocessLauncher):
    """Runs each task as ``bash -c <script>`` in its own session, on the pilot's own host."""

    name = "local"

    def __init__(self, bash: str | None = None, *, gpu_env: str = CUDA_VISIBLE_DEVICES) -> None:
        """``gpu_env``: the variable that carries the task's GPU ids on this machine."""
        # An absolute path, so that a task env without PATH still starts.
        self.bash = bash or shutil.which("bash") or "/bin/bash"
        self.gpu_env = gpu_env

    def task_env(self, spec: TaskSpec) -> dict[str, str]:
        return render_env(spec, self.gpu_env)

    def render_command(self, spec: TaskSpec) -> list[str]:
        refuse_launch_params(spec, self.name)
        return render_command(spec, self.bash)

    def argv_for(self, spec: TaskSpec, env: dict[str, str]) -> list[str]:
        return self.render_command(spec)

    def spawn(
        self, argv: list[str], spec: TaskSpec, env: dict[str, str], fds: list[int]
    ) -> subprocess.Popen[bytes]:
        proc = self._start_direct(spec, env, fds)
        return proc if proc is not None else popen(argv, spec, env, fds)

    def _start_direct(
        self, spec: TaskSpec, env: dict[str, str], fds: list[int]
    ) -> subprocess.Popen[bytes] | None:
        """The task without bash, or None when bash must run it (it also reports exec errors:
        a file without ``#!`` that bash runs as a script, a binary for another machine, …)."""
        env = {**env, **spec.argv_env}  # what the script would have exported
        argv = direct_command(spec, env)
        if argv is None:
            return None
        try:
            return popen(argv, spec, env, fds)
        except OSError:
            return None
