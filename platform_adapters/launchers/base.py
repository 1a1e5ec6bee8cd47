"""The app-launcher interface: start a job's script on its allocation and manage the process.

A backend (local, the MPI launchers: mpiexec of MPICH, PALS and Open MPI, srun, aprun, jsrun,
flux run) is an ``AppLauncher`` with a pure ``render_command`` (the argv it will run) and a
``start`` that makes the one subprocess call. ``start`` returns a ``RunningTask`` that the
launcher's loop polls.

Contract shared by every backend, and checked by one shared test suite:

* the task runs in ``spec.workdir`` with ``render_env(spec)`` as its whole environment (callers
  that want the pilot's own environment inherited put it in ``spec.env``);
* stdout and stderr go to ``spec.stdout_path`` / ``spec.stderr_path``, truncated at start (they
  may be the same path); the directories must exist;
* the task is the leader of its own process group; ``terminate`` and ``kill`` signal the whole
  group, so helpers the script started die with it;
* a task ended by a signal reports ``returncode == -signum``, as ``subprocess`` does;
* ``terminate(grace_s)`` does not block: it sends SIGTERM now, and the next ``poll``/``wait``
  after ``grace_s`` sends SIGKILL. A launcher draining hundreds of tasks terminates them all and
  keeps polling, instead of waiting out each grace period in turn.

Tasks are not thread-safe; one launcher loop owns each.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from lodestream.platform_adapters.packing import Allocation

DEFAULT_GRACE_S = 10.0
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
DEFAULT_TAIL_BYTES = 4096


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskSpec:
    """Everything a backend needs to run one job on its allocation.

    ``script`` is a bash script body rendered by the site (the app's command with its parameters
    shell-quoted, after the app's preamble); it is trusted site code. Nothing else in the spec is
    ever parsed by a shell. ``launch_params`` are backend-specific extras (e.g. mpiexec binding
    options) that backends which do not know them ignore.

    ``argv``, when the site sets it, is the same job without the shell: the script's command as
    words, with ``argv_env`` the variables the script exports before it. It is set only when
    running the words directly is equivalent to running the script, so a backend may use either.
    """

    job_id: str
    script: str
    workdir: Path
    env: Mapping[str, str]
    allocation: Allocation
    stdout_path: Path
    stderr_path: Path
    ranks_per_node: int = 1
    threads_per_rank: int = 1
    threads_per_core: int = 1
    gpus_per_rank: int = 0
    launch_params: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    argv: tuple[str, ...] | None = None
    argv_env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def hostnames(self) -> tuple[str, ...]:
        return self.allocation.hostnames

    @property
    def num_ranks(self) -> int:
        return self.ranks_per_node * self.allocation.num_nodes

    @property
    def gpu_ids(self) -> tuple[str, ...]:
        """The gpu ids of all placements, first appearance first (virtual nodes may share)."""
        return tuple(dict.fromkeys(g for p in self.allocation.placements for g in p.gpu_ids))


def render_env(spec: TaskSpec, gpu_env: str = CUDA_VISIBLE_DEVICES) -> dict[str, str]:
    """The task's whole environment: ``spec.env`` plus ``launch_env(spec, gpu_env)``."""
    return {**spec.env, **launch_env(spec, gpu_env)}


def launch_env(spec: TaskSpec, gpu_env: str = CUDA_VISIBLE_DEVICES) -> dict[str, str]:
    """What every backend sets on top of ``spec.env``.

    ``OMP_NUM_THREADS``, ``LODE_JOB_ID``, ``LODE_NODE_HOSTNAMES`` (comma-separated), and, when
    the allocation has gpus, the machine's visibility variable ``gpu_env`` with their ids
    (``CUDA_VISIBLE_DEVICES``, ``ROCR_VISIBLE_DEVICES`` or ``ZE_AFFINITY_MASK``); for CUDA also
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so that the ids mean what ``nvidia-smi`` shows.
    """
    env = {
        "OMP_NUM_THREADS": str(spec.threads_per_rank),
        "LODE_JOB_ID": spec.job_id,
        "LODE_NODE_HOSTNAMES": ",".join(spec.hostnames),
    }
    gpu_ids = spec.gpu_ids
    if gpu_ids:
        env[gpu_env] = ",".join(gpu_ids)
        if gpu_env == CUDA_VISIBLE_DEVICES:
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def read_tail(path: Path, max_bytes: int = DEFAULT_TAIL_BYTES) -> str:
    """The last ``max_bytes`` of a file as text ('' if it does not exist); bad UTF-8 is replaced."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes)
    except FileNotFoundError:
        return ""
    return data.decode("utf-8", errors="replace")


class RunningTask(ABC):
    """One started task. ``poll`` never blocks; ``wait`` does, up to its timeout."""

    def __init__(self, spec: TaskSpec) -> None:
        self.spec = spec

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    @property
    @abstractmethod
    def pid(self) -> int:
        """Process id of the group leader (the backend's own fake id for a fake)."""

    @property
    @abstractmethod
    def returncode(self) -> int | None:
        """The exit status once ``poll``/``wait`` saw the task end; ``-signum`` if signalled."""

    @abstractmethod
    def poll(self) -> int | None:
        """The exit status if the task has ended, else ``None``, without blocking.

        While a ``terminate`` is pending, this is also where SIGKILL is sent once the grace
        period is over.
        """

    @abstractmethod
    def wait(self, timeout: float | None = None) -> int:
        """Block until the task ends and return its status; ``WaitTimedOut`` after ``timeout``."""

    @abstractmethod
    def terminate(self, grace_s: float = DEFAULT_GRACE_S) -> None:
        """SIGTERM the whole process group now; SIGKILL it after ``grace_s`` (see module doc).

        A no-op once the task has ended.
        """

    @abstractmethod
    def kill(self) -> None:
        """SIGKILL the whole process group now. A no-op once the task has ended."""

    def exit_fd(self) -> int | None:
        """A new descriptor that becomes readable when the task ends, or None if there is none.

        Lets a caller wait for thousands of tasks in its event loop instead of polling each one.
        The caller closes it; ``poll`` is still how the status is read.
        """
        return None

    def stderr_tail(self, max_bytes: int = DEFAULT_TAIL_BYTES) -> str:
        """The end of what the task wrote to stderr, for the job's error event."""
        return read_tail(self.spec.stderr_path, max_bytes)

    @property
    def lost(self) -> str | None:
        """Why the task's end could not be observed, once it has a status; None if it was.

        A task run by another process (a worker rank on another node) is lost with that
        process: its status is then the backend's placeholder, and the job did not fail, its
        runner did. Tasks this process started itself are never lost.
        """
        return None


class AppLauncher(ABC):
    """Runs tasks on their allocations, one backend per platform launcher (local, mpiexec, ...)."""

    name: str

    @abstractmethod
    def render_command(self, spec: TaskSpec) -> list[str]:
        """The argv ``start`` runs for ``spec``; pure, so it can be logged and tested."""

    @abstractmethod
    def start(self, spec: TaskSpec) -> RunningTask:
        """Start the task and return at once; ``StartFailed`` if no process could be started."""

    def check_available(self) -> None:
        """Raise ``LauncherUnavailable`` if this backend cannot start tasks on this host.

        The pilot calls it once at start, so that a missing ``mpiexec`` is one clear error
        instead of every job failing. Backends that need nothing from the host do nothing.
        """
        return
