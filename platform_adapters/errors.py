"""Errors of the platform adapters.

PlatformError
├── ResourceError
│   ├── InvalidNodeSpec        a node description is malformed (duplicate ids, duplicate hostnames)
│   ├── InvalidRequest         a job's resource request is malformed or already allocated
│   ├── InsufficientResources  assign() on a node that cannot hold the job right now
│   └── UnknownJob             release() of a job id that holds nothing here
├── DiscoveryError             the allocation or host cannot be described as the nodes asked for
│   ├── InvalidHostlist        a hostlist or id range ("nid[001-003]", "1-3,7") is malformed
│   ├── AllocationNotFound     the environment holds no allocation of that scheduler
│   └── SchedulerQueryFailed   a scheduler command failed, or printed what cannot be read
├── InvalidMachine             a machine description is missing, or not a valid description
├── LaunchError
│   ├── StartFailed            the task's process could not be started; nothing is running
│   │   └── InvalidLaunchParams  a job's launch_params are not options this backend passes on
│   ├── LauncherUnavailable    the launcher's executable (mpiexec, srun, ...) is not on PATH
│   └── WaitTimedOut           wait(timeout) returned before the task ended; it still runs
├── SchedulerError
│   ├── SchedulerUnavailable   the scheduler's command is missing or cannot be executed here
│   ├── SchedulerTimeout       the scheduler's command did not answer within its timeout
│   ├── SchedulerCommandFailed the command exited non-zero; the message carries its own words
│   │   └── SubmitRejected     the scheduler refused a submission (bad queue, project, limits)
│   ├── UnparseableOutput      the command's output as a whole could not be understood
│   ├── InvalidSubmission      the request cannot be rendered (bad option name, zero nodes)
│   ├── InvalidJobId           not an id a scheduler hands out (it could read as an option)
│   ├── UnknownBatchJob        the scheduler has no record of that job id
│   └── NotSupported           this scheduler cannot answer that question (e.g. backfill)
└── UnknownBackend             no backend is registered under that name
"""

from __future__ import annotations


class PlatformError(Exception):
    """Base of platform adapter errors."""


class ResourceError(PlatformError):
    """Base of node and packing errors."""


class InvalidNodeSpec(ResourceError, ValueError):
    """A NodeSpec (or a set of them) cannot describe real nodes."""


class InvalidRequest(ResourceError, ValueError):
    """A JobRequest has out-of-range values, or its job id is already allocated."""


class InsufficientResources(ResourceError):
    """A node was asked to hold a job that does not fit on it now; callers check ``fits`` first."""


class UnknownJob(ResourceError, KeyError):
    """A job id was released that holds no resources here (released twice, or never assigned)."""

    def __str__(self) -> str:
        # KeyError would repr() the message and wrap it in quotes.
        return str(self.args[0]) if self.args else ""


class DiscoveryError(PlatformError, ValueError):
    """The pilot's nodes cannot be described: the local host cannot be split as asked, or the
    batch allocation (or the scheduler's answer about it) cannot be read."""


class InvalidHostlist(DiscoveryError, ValueError):
    """A hostlist (``nid[001-003,007]``) or id range (``1-3,7``) cannot be expanded."""


class AllocationNotFound(DiscoveryError):
    """The variables a scheduler sets inside a batch job are missing: not in such a job."""


class SchedulerQueryFailed(DiscoveryError):
    """A scheduler command (squeue, qstat, bjobs, flux) failed, or its output is unreadable."""


class InvalidMachine(PlatformError, ValueError):
    """A machine description file is missing, not YAML, or fails validation; the message says
    which file and which field."""


class LaunchError(PlatformError):
    """Base of app launcher errors."""


class StartFailed(LaunchError):
    """The task's process was not started (workdir, output files, exec); nothing needs cleaning."""


class InvalidLaunchParams(StartFailed, ValueError):
    """A job's ``launch_params`` name an option the backend does not pass on, or are malformed.

    Raised when the task is started (``render_command`` raises it too); the job fails with it.
    """


class LauncherUnavailable(LaunchError):
    """The launcher's executable is not on PATH; ``check_available`` raises it at pilot start."""


class WaitTimedOut(LaunchError, TimeoutError):
    """``RunningTask.wait(timeout)`` gave up; the task keeps running."""


class SchedulerError(PlatformError):
    """Base of batch scheduler adapter errors."""


class SchedulerUnavailable(SchedulerError):
    """The scheduler's command is not installed, not on PATH, or not executable; names it."""


class SchedulerTimeout(SchedulerError, TimeoutError):
    """The scheduler's command ran past its timeout and was killed (a hung controller)."""


class SchedulerCommandFailed(SchedulerError):
    """The command exited non-zero. ``str()`` quotes what the scheduler itself printed."""

    def __init__(self, message: str, *, argv: tuple[str, ...] = (), returncode: int = 0) -> None:
        super().__init__(message)
        self.argv = argv
        self.returncode = returncode


class SubmitRejected(SchedulerCommandFailed):
    """The scheduler refused the submission; nothing was queued."""


class UnparseableOutput(SchedulerError, ValueError):
    """A command's output could not be understood as a whole (single bad lines are skipped)."""


class InvalidSubmission(SchedulerError, ValueError):
    """A submission request cannot be turned into a command line; nothing was run."""


class InvalidJobId(SchedulerError, ValueError):
    """A job id that no scheduler hands out; refused before it reaches a command line."""


class UnknownBatchJob(SchedulerError, LookupError):
    """The scheduler (or its accounting) has no record of the job id asked about."""


class NotSupported(SchedulerError):
    """The adapter cannot answer this; ``Scheduler.capabilities`` says so beforehand."""


class UnknownBackend(PlatformError, LookupError):
    """A registry was asked for a backend name it does not know; the message lists known names."""
