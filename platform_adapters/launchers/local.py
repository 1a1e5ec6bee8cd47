"""Local app launcher: runs the job's script with ``bash -c`` on this host, or its words directly.

Like Balsam's local app run, the script runs once whatever ``ranks_per_node`` says (MPI ranks
are the business of the mpiexec/srun backends), and tasks are not pinned to their cpu ids: the
ids are bookkeeping that keeps packing honest. Starting is one ``subprocess.Popen`` with no
``preexec_fn`` (so CPython can use vfork) and output files opened as raw descriptors. When the
site gives the job's words (``TaskSpec.argv``) and the program is a file we can find, they are
executed without bash, which saves bash's start-up (about 1 ms of CPU, most of a short task's
cost); a program that is not found is left to bash, so the job fails as it would have, with
bash's message and status 127.

Processes that the script leaves running in the background when it exits normally are not
killed; ``terminate`` and ``kill`` sweep the whole process group. The grace period of
``terminate`` is the group leader's: once it has exited, whatever is left in its group is killed
at once (there is no cheap way to watch a group empty). Bash (5.1+) execs the last command of a
``-c`` script, so with a site-rendered script the leader is normally the app itself and gets the
whole grace period to checkpoint. Helpers that start their own session (``setsid``, daemons)
leave the group and are out of reach, as with any batch system.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from lodestream.platform_adapters.errors import StartFailed, WaitTimedOut
from lodestream.platform_adapters.launchers.base import (
    DEFAULT_GRACE_S,
    AppLauncher,
    RunningTask,
    TaskSpec,
    render_env,
)

_OUTPUT_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
_POLL_MAX_S = 0.05


def render_command(spec: TaskSpec, bash: str = "/bin/bash") -> list[str]:
    """``bash -c <script>``: the script travels as one argv entry, never re-parsed by a shell."""
    return [bash, "-c", spec.script]


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


class LocalLauncher(AppLauncher):
    """Runs each task as ``bash -c <script>`` in its own session, on the pilot's own host."""

    name = "local"

    def __init__(self, bash: str | None = None) -> None:
        # An absolute path, so that a task env without PATH still starts.
        self.bash = bash or shutil.which("bash") or "/bin/bash"

    def render_command(self, spec: TaskSpec) -> list[str]:
        return render_command(spec, self.bash)

    def start(self, spec: TaskSpec) -> LocalTask:
        env = render_env(spec)
        fds: list[int] = []
        try:
            fds.append(os.open(spec.stdout_path, _OUTPUT_FLAGS, 0o666))
            if spec.stderr_path != spec.stdout_path:
                fds.append(os.open(spec.stderr_path, _OUTPUT_FLAGS, 0o666))
            proc = self._start_direct(spec, env, fds)
            if proc is None:
                proc = self._popen(self.render_command(spec), spec, env, fds)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            raise StartFailed(f"job {spec.job_id}: could not start: {exc}") from exc
        finally:
            for fd in fds:
                os.close(fd)
        return LocalTask(spec, proc)

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
            return self._popen(argv, spec, env, fds)
        except OSError:
            return None

    @staticmethod
    def _popen(
        argv: list[str], spec: TaskSpec, env: dict[str, str], fds: list[int]
    ) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            argv,
            cwd=spec.workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=fds[0],
            stderr=fds[-1],
            start_new_session=True,
        )


class LocalTask(RunningTask):
    """A local task: ``bash`` (or the program itself) leading its own session and process group."""

    def __init__(self, spec: TaskSpec, proc: subprocess.Popen[bytes]) -> None:
        super().__init__(spec)
        self._proc = proc
        # Set by terminate()/kill(): when SIGKILL is due. Signals go to the group only while the
        # leader is unreaped, because its zombie keeps the group id from being reused.
        self._kill_at: float | None = None
        self._killed = False

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    def exit_fd(self) -> int | None:
        if self._proc.returncode is not None:
            return None
        try:
            return os.pidfd_open(self._proc.pid)  # Linux 5.3+; the unreaped leader is ours
        except (AttributeError, OSError):
            return None

    def poll(self) -> int | None:
        if self._proc.returncode is not None or self._kill_at is None:
            return self._proc.poll()
        exited = self._leader_exited()
        if exited is None:
            return self._proc.poll()  # reaped behind our back: the group id is no longer ours
        if not exited:
            if not self._killed and time.monotonic() >= self._kill_at:
                self._signal_group(signal.SIGKILL)
                self._killed = True
            return None
        # The leader is gone but may have left members that ignored SIGTERM; sweep them
        # before reaping frees the group id.
        self._signal_group(signal.SIGKILL)
        return self._proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        if self._kill_at is None:
            try:
                return self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                raise WaitTimedOut(f"job {self.job_id} still running after {timeout}s") from None
        # Terminating: poll, so that escalation and the final sweep happen here too.
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while (status := self.poll()) is None:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise WaitTimedOut(f"job {self.job_id} still running after {timeout}s")
            nap = delay
            if deadline is not None:
                nap = min(nap, deadline - now)
            if not self._killed:
                nap = min(nap, max(self._kill_at - now, 0.0))
            time.sleep(nap)
            delay = min(delay * 2, _POLL_MAX_S)
        return status

    def terminate(self, grace_s: float = DEFAULT_GRACE_S) -> None:
        if self._proc.returncode is not None:
            return
        kill_at = time.monotonic() + max(grace_s, 0.0)
        self._kill_at = kill_at if self._kill_at is None else min(self._kill_at, kill_at)
        self._signal_group(signal.SIGTERM)

    def kill(self) -> None:
        if self._proc.returncode is not None:
            return
        self._kill_at = time.monotonic()
        self._signal_group(signal.SIGKILL)
        self._killed = True

    def _leader_exited(self) -> bool | None:
        """Whether the leader has exited, looking without reaping (WNOWAIT); None if reaped."""
        try:
            info = os.waitid(os.P_PID, self._proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return None
        return info is not None

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, sig)
