"""Starting a task as one process that leads its own session, and managing that process group.

Shared by every backend that runs something on the pilot's host: the local launcher (``bash
-c <script>`` or the program itself) and the MPI launchers (``mpiexec``/``srun``/... whose
argv ends with ``bash -c <script>``). Starting is one ``subprocess.Popen`` with no
``preexec_fn`` (so CPython can use vfork) and output files opened as raw descriptors.

Processes that the task leaves running in the background when it exits normally are not
killed; ``terminate`` and ``kill`` sweep the whole process group. The grace period of
``terminate`` is the group leader's: once it has exited, whatever is left in its group is killed
at once (there is no cheap way to watch a group empty). An MPI launcher forwards SIGTERM to its
ranks (on other nodes too) and exits when they have; the sweep then only reaches what is left
on this host. Helpers that start their own session (``setsid``, daemons) leave the group and
are out of reach, as with any batch system.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from abc import abstractmethod

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


class SubprocessLauncher(AppLauncher):
    """A backend whose task is one process on this host; starting and managing it is shared.

    A backend says what to run (``argv_for``) and may change how it is spawned (``spawn``).
    ``argv_for`` runs before any output file is touched, so a task refused there (bad
    ``launch_params``, no launcher on PATH) leaves nothing behind.
    """

    def task_env(self, spec: TaskSpec) -> dict[str, str]:
        """The whole environment of the started process."""
        return render_env(spec)

    @abstractmethod
    def argv_for(self, spec: TaskSpec, env: dict[str, str]) -> list[str]:
        """The argv to execute, its program resolved; ``StartFailed`` if there is none."""

    def spawn(
        self, argv: list[str], spec: TaskSpec, env: dict[str, str], fds: list[int]
    ) -> subprocess.Popen[bytes]:
        return popen(argv, spec, env, fds)

    def start(self, spec: TaskSpec) -> ProcessTask:
        env = self.task_env(spec)
        argv = self.argv_for(spec, env)
        fds: list[int] = []
        try:
            fds.append(os.open(spec.stdout_path, _OUTPUT_FLAGS, 0o666))
            if spec.stderr_path != spec.stdout_path:
                fds.append(os.open(spec.stderr_path, _OUTPUT_FLAGS, 0o666))
            proc = self.spawn(argv, spec, env, fds)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            raise StartFailed(f"job {spec.job_id}: could not start: {exc}") from exc
        finally:
            for fd in fds:
                os.close(fd)
        return ProcessTask(spec, proc)


def popen(
    argv: list[str], spec: TaskSpec, env: dict[str, str], fds: list[int]
) -> subprocess.Popen[bytes]:
    """``argv`` in ``spec.workdir`` with ``env`` as its whole environment, stdout/stderr on
    ``fds`` (one descriptor: both), no stdin, leading a new session."""
    return subprocess.Popen(
        argv,
        cwd=spec.workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=fds[0],
        stderr=fds[-1],
        start_new_session=True,
    )


class ProcessTask(RunningTask):
    """A started process leading its own session and process group (bash, the program itself,
    or an MPI launcher such as ``mpiexec``, whose ranks stay in its group on this host)."""

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
