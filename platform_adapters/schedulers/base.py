"""The batch scheduler interface: submit pilot jobs, watch them, delete them, ask what is free.

A backend (slurm, pbs, lsf, cobalt, flux, local) is a ``Scheduler``. The command-line ones are
pure ``render_*`` functions (argv, script directives) and pure ``parse_*`` functions (of a
command's stdout, stderr and status) around one subprocess call each, made through an injectable
``CommandRunner`` (``runner.py``). ``FakeScheduler`` keeps its jobs in memory.

Contract shared by every backend, and checked by one shared test suite
(``tests/support/scheduler_contract.py``):

* ``submit`` returns the scheduler's id for the job as a non-empty string, the one every other
  method takes. A refusal raises ``SubmitRejected`` with the scheduler's own words; nothing is
  queued then.
* ``status(ids)`` maps each id the scheduler still lists to a ``BatchStatus``; an id it no
  longer (or never) knew is simply absent, never an error: finished jobs leave most queues, and
  ``accounting`` is where their end is read. ``status()`` with no ids lists all of this user's
  jobs. Native states map through one table per backend onto ``SchedulerState``; a native state
  the table does not know becomes ``UNKNOWN`` with a warning logged.
* ``delete(id)`` asks the scheduler to end the job and returns True; it returns False when the
  job had already ended or is unknown (the race every deleter meets), and raises on anything else.
* ``backfill_windows()`` says which nodes are free now, and for how long, per queue, where the
  scheduler can tell (``capabilities.backfill``); ``NotSupported`` otherwise.
* ``accounting(id)`` reads the job's record after the fact (start, end, exit status, final
  state); ``UnknownBatchJob`` if there is none. While the job is still queued or running the
  record says so and has no end.
* Ids handed in are checked first: one that could read as an option raises ``InvalidJobId``.
* A command that is missing raises ``SchedulerUnavailable`` naming it, one that hangs raises
  ``SchedulerTimeout``, one that fails raises ``SchedulerCommandFailed`` quoting its stderr. In
  output that parses, a line that does not is skipped with a warning; output that does not parse
  at all raises ``UnparseableOutput``.

Times are tz-aware UTC. Schedulers that print local wall-clock times are read in the adapter's
``tz`` (the login node's zone when not given).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import ClassVar, Final

from lodestream.platform_adapters.errors import InvalidJobId, InvalidSubmission, NotSupported
from lodestream.platform_adapters.schedulers.directives import request_problem
from lodestream.schemas.resources import FINAL_SCHEDULER_STATES, SchedulerState

# Option names become `--name=value` / `-name value`: a name must not be able to smuggle in a
# different flag or a value of its own.
OPTION_NAME: Final = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
ENV_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Ids go on command lines as words of their own; one starting with '-' would be an option.
JOB_ID: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@\[\]-]{0,254}$")
MAX_WALL_TIME_MIN: Final = 60 * 24 * 365
MAX_NODES: Final = 1_000_000


def _empty() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchRequest:
    """What a pilot job asks the scheduler for; validated on construction.

    ``options`` are scheduler-native settings that each backend renders its own way (Slurm
    ``--name=value``, PBS ``-l name=value``, LSF ``-name value``; an empty value renders a bare
    flag); their names are checked against ``OPTION_NAME``. Project, queue, job name and option
    values must each be one word of data to any scheduler (``directives.request_problem``).
    ``extra_args`` are argv words added verbatim before the script, for what options cannot
    say. ``env`` is exported to the job. Empty ``project`` or ``queue`` leave the scheduler's
    default.
    """

    project: str = ""
    queue: str = ""
    nodes: int = 1
    wall_time_min: int
    job_name: str = ""
    options: Mapping[str, str] = field(default_factory=_empty)
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=_empty)

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= MAX_NODES:
            raise InvalidSubmission(f"nodes must be in [1, {MAX_NODES}], not {self.nodes}")
        if not 1 <= self.wall_time_min <= MAX_WALL_TIME_MIN:
            raise InvalidSubmission(
                f"wall_time_min must be in [1, {MAX_WALL_TIME_MIN}], not {self.wall_time_min}"
            )
        for name in self.options:
            if not OPTION_NAME.fullmatch(name):
                raise InvalidSubmission(
                    f"option name {name!r} does not match {OPTION_NAME.pattern}"
                )
        # Each becomes the value of a flag on the command line and in a script directive:
        # one word of data, whatever the scheduler (each backend checks its rendering again).
        problem = request_problem([
            ("project", self.project), ("queue", self.queue), ("job_name", self.job_name),
            *((f"option {name}", value) for name, value in self.options.items()),
        ])  # fmt: skip
        if problem is not None:
            raise InvalidSubmission(problem)
        for word in self.extra_args:
            _check_text("extra argument", word)
        for name, value in self.env.items():
            if not ENV_NAME.fullmatch(name):
                raise InvalidSubmission(f"environment name {name!r} is not a shell variable name")
            if "\x00" in value:
                raise InvalidSubmission(f"environment value of {name} contains NUL")
        # Freeze the mappings the caller handed in, so a request cannot change after checking.
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        object.__setattr__(self, "extra_args", tuple(self.extra_args))


def check_job_id(job_id: str) -> str:
    """``job_id`` if it looks like an id some scheduler hands out, else ``InvalidJobId``."""
    if not JOB_ID.fullmatch(job_id):
        raise InvalidJobId(f"{job_id!r} is not a batch job id")
    return job_id


def _check_text(what: str, value: str) -> None:
    # A newline would end a `#SBATCH` directive early and start a line of script.
    if "\x00" in value or "\n" in value or "\r" in value:
        raise InvalidSubmission(f"{what} {value!r} contains a NUL or a line break")


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchStatus:
    """One job as the scheduler lists it now. Unknown numbers are None, unknown text ''."""

    scheduler_id: str
    state: SchedulerState
    native_state: str
    nodes: int = 0
    hostnames: tuple[str, ...] = ()
    queue: str = ""
    wall_time_min: int | None = None
    start_time: datetime | None = None
    elapsed_s: int | None = None
    reason: str = ""
    exit_code: int | None = None
    # The job's name as submitted (``job_name``), where the listing shows it ('' otherwise):
    # a submitter that lost the id can find its job again by the name it gave it.
    name: str = ""

    @property
    def final(self) -> bool:
        return self.state in FINAL_SCHEDULER_STATES


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchRecord:
    """A job's accounting record: how it ended (``state`` is final once ``end_time`` is set).

    ``exit_code`` is the batch script's status; ``signal`` the signal that ended it, where the
    scheduler records one (Slurm's ``ExitCode=0:15``).
    """

    scheduler_id: str
    state: SchedulerState
    native_state: str
    start_time: datetime | None = None
    end_time: datetime | None = None
    exit_code: int | None = None
    signal: int | None = None
    nodes: int = 0
    hostnames: tuple[str, ...] = ()
    reason: str = ""

    @property
    def final(self) -> bool:
        return self.state in FINAL_SCHEDULER_STATES

    @classmethod
    def from_status(cls, status: BatchStatus) -> BatchRecord:
        """The record of a job its scheduler still lists: what is known so far, no end."""
        return cls(
            scheduler_id=status.scheduler_id,
            state=status.state,
            native_state=status.native_state,
            start_time=status.start_time,
            exit_code=status.exit_code,
            nodes=status.nodes,
            hostnames=status.hostnames,
            reason=status.reason,
        )


@dataclass(frozen=True, slots=True, order=True)
class BackfillWindow:
    """``nodes`` nodes of ``queue`` are free now for at least ``minutes`` (None: no known limit).

    Windows of one queue are cumulative: a list holds, longest first, each distinct length with
    every node free at least that long, so the elastic queue can pick the shape it likes.
    """

    queue: str
    nodes: int
    minutes: int | None


@dataclass(frozen=True, slots=True)
class Capabilities:
    """Which optional questions a backend can answer; the others raise ``NotSupported``."""

    backfill: bool
    accounting: bool


class Scheduler(ABC):
    """A batch scheduler the site agent submits pilot jobs to; see the module doc for the contract.

    Methods block for at most the adapter's command timeout; call them from a worker thread in
    async code. Instances hold no per-job state except the local and fake backends, which are the
    scheduler.
    """

    name: ClassVar[str]
    capabilities: ClassVar[Capabilities]

    def submit(
        self,
        script_path: str | Path,
        *,
        project: str = "",
        queue: str = "",
        nodes: int = 1,
        wall_time_min: int,
        job_name: str = "",
        options: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> str:
        """Submit the script at ``script_path`` as a batch job; return the scheduler's id.

        Raises ``InvalidSubmission`` before running anything if the request cannot be rendered,
        and ``SubmitRejected`` if the scheduler refuses it. The job's output files go beside the
        script, named after it.
        """
        request = BatchRequest(
            project=project,
            queue=queue,
            nodes=nodes,
            wall_time_min=wall_time_min,
            job_name=job_name,
            options=options or {},
            extra_args=tuple(extra_args),
            env=env or {},
        )
        return self.submit_request(Path(script_path).absolute(), request)

    @abstractmethod
    def submit_request(self, script_path: Path, request: BatchRequest) -> str:
        """``submit`` with a request already built; ``script_path`` is absolute."""

    def status(self, ids: Collection[str] | None = None) -> dict[str, BatchStatus]:
        """The jobs with these ids that the scheduler lists (all of this user's if None)."""
        if ids is None:
            return self.list_jobs(None)
        wanted = tuple(dict.fromkeys(check_job_id(job_id) for job_id in ids))
        found = self.list_jobs(wanted)
        return {job_id: status for job_id, status in found.items() if job_id in wanted}

    @abstractmethod
    def list_jobs(self, ids: tuple[str, ...] | None) -> dict[str, BatchStatus]:
        """What the scheduler lists for ``ids`` (or for this user); may include other ids."""

    def delete(self, scheduler_id: str) -> bool:
        """Ask the scheduler to end the job: True if asked, False if it had already gone."""
        return self.delete_job(check_job_id(scheduler_id))

    @abstractmethod
    def delete_job(self, scheduler_id: str) -> bool:
        """``delete`` with an id already checked."""

    def backfill_windows(self) -> list[BackfillWindow]:
        """Free nodes per queue and how long they stay free; ``NotSupported`` if unknowable."""
        raise NotSupported(f"the {self.name} scheduler adapter cannot tell backfill windows")

    def accounting(self, scheduler_id: str) -> BatchRecord:
        """The job's accounting record; ``UnknownBatchJob`` if the scheduler has none."""
        return self.read_accounting(check_job_id(scheduler_id))

    def read_accounting(self, scheduler_id: str) -> BatchRecord:
        """``accounting`` with an id already checked; adapters that keep records override it."""
        raise NotSupported(f"the {self.name} scheduler adapter keeps no accounting")

    @abstractmethod
    def render_script_header(self, request: BatchRequest) -> str:
        """The script's directive lines (``#SBATCH ...``), each ending in a newline; pure."""

    def render_script(self, body: str, request: BatchRequest) -> str:
        """A whole batch script: shebang, directives, then ``body``; pure.

        Directives repeat what ``submit`` passes on the command line, so a script left on disk
        says what it asked for and can be resubmitted by hand.
        """
        return "#!/bin/bash\n" + self.render_script_header(request) + body
