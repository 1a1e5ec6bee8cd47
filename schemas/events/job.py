"""Job lifecycle events (docs/architecture.md §4). Past tense; one class per fact."""

from __future__ import annotations

import itertools
import uuid
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import AwareDatetime, Field, field_validator, model_validator

from lodestream.schemas.envelope import EXACT_VERSION, Event, EventData
from lodestream.schemas.placement import SiteChoice
from lodestream.schemas.resources import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    JobSpec,
    check_storable,
)
from lodestream.schemas.retry import MAX_BACKOFF_S
from lodestream.schemas.states import CREATED_RUNNABLE
from lodestream.schemas.upcast import upcaster

MAX_TAIL = 4096


class StepData(EventData):
    """A controller or site step. ``skipped`` names steps with nothing to do, in order.

    ``work`` carries the job's spec on events that hand work to a site consumer
    (``launch-<site>``, ``process-<site>``), so a site never needs to read
    anything beyond its own subjects.
    """

    skipped: tuple[str, ...] = ()
    note: str = ""
    work: JobSpec | None = None
    attempt: int = Field(1, ge=1, le=INT32_MAX)


class ParentsData(EventData):
    parent_ids: tuple[uuid.UUID, ...] = Field(min_length=1)


class LeaseData(EventData):
    session_id: uuid.UUID
    reason: str = ""
    work: JobSpec | None = None  # set when the job becomes runnable again (release, expiry)
    attempt: int = Field(1, ge=1, le=INT32_MAX)


DeviceIndex = Annotated[int, Field(ge=0, le=INT32_MAX)]
"""A core or GPU index on a node. Bounded so that JSON parsers agree on it: orjson reads an
integer beyond 64 bits as a float, pydantic's parser as an int."""


class Placement(EventData):
    hostname: str
    cores: tuple[DeviceIndex, ...] = ()
    gpus: tuple[DeviceIndex, ...] = ()


class StartedData(EventData):
    session_id: uuid.UUID
    skipped: tuple[str, ...] = ()
    placement: tuple[Placement, ...] = ()
    # Always None: this is the lease, appended before the task is spawned; the run's pid
    # is in its result's profile (RunProfile.pid).
    pid: int | None = Field(None, ge=0, le=INT32_MAX)
    attempt: int = Field(1, ge=1, le=INT32_MAX)


class CacheUseData(EventData):
    """What the job's cacheable inputs cost at its node's cache (agents/launcher/cache.py).

    ``hits``: inputs the node held already; ``misses``: inputs copied into its cache
    (``bytes_copied`` in all); ``bypassed``: inputs the job read from the shared copy (no room,
    or not a file). Recorded with the run's result, not in ``job.started``: that event is the
    lease, and the pilot touches the job's workdir only once it holds it.
    """

    node: str
    hits: int = Field(0, ge=0, le=INT32_MAX)
    misses: int = Field(0, ge=0, le=INT32_MAX)
    bytes_copied: int = Field(0, ge=0, le=INT64_MAX)
    bypassed: int = Field(0, ge=0, le=INT32_MAX)


class RunProfile(EventData):
    """When the pilot did what for one run: per-component timestamps, as RADICAL-Pilot records.

    ``leased_at``: the pilot's ``job.started`` (the lease) was acknowledged; ``spawning_at``:
    it began spawning the task (rendering its script, then fork/exec); ``started_at``: the
    process was started (the launcher's ``Popen`` returned); ``exited_at``: the pilot observed
    its end. The result event's own ``occurred_at`` is when the result was sent. ``pid`` is
    the task's process id (on the worker rank's node for a task of an mpi-mode pilot, whose
    times are rank 0's observations). It is recorded here and not in ``job.started``: that
    event is the lease and is appended before the task is spawned (docs/architecture.md §9,
    "Profiling inside the pilot").

    The times are the pilot's wall clock and must not go backwards; a step of that clock
    during a run makes the pilot leave the profile out rather than lose the result.
    """

    leased_at: AwareDatetime
    spawning_at: AwareDatetime | None = None
    started_at: AwareDatetime | None = None
    exited_at: AwareDatetime | None = None
    pid: int | None = Field(None, ge=0, le=INT32_MAX)

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        steps = [("leased_at", self.leased_at), ("spawning_at", self.spawning_at),
                 ("started_at", self.started_at), ("exited_at", self.exited_at)]  # fmt: skip
        known = [(name, at) for name, at in steps if at is not None]
        for (before, early), (after, late) in itertools.pairwise(known):
            if late < early:
                raise ValueError(f"{after} ({late.isoformat()}) is before {before} "
                                 f"({early.isoformat()})")  # fmt: skip
        if self.pid is not None and self.started_at is None:
            raise ValueError("a pid without started_at: no process was started")
        return self


class RunResultData(EventData):
    return_code: int | None = Field(None, ge=INT32_MIN, le=INT32_MAX)
    stderr_tail: str = Field("", max_length=MAX_TAIL)
    runtime_s: float | None = Field(None, ge=0, allow_inf_nan=False)  # as the codec reads it
    result: Any = None  # a Python app's return value, stored as jsonb
    cause: tuple[str, ...] = ()
    work: JobSpec | None = None  # for the site's postprocess / handle_error / handle_timeout
    attempt: int = Field(1, ge=1, le=INT32_MAX)
    cache: CacheUseData | None = None  # set when the app has cacheable inputs and the pilot a cache
    profile: RunProfile | None = None  # when the pilot leased, spawned, started and saw the end

    @field_validator("result")
    @classmethod
    def _storable_result(cls, value: Any) -> Any:
        check_storable([value], "result")  # a list, so a bare scalar is judged too
        return value


class FinishedData(StepData):
    """``job.finished``. ``run`` is set when the lease holder finishes the job at the end of
    its run (no ``postprocess`` hook, nothing to stage out): the event then stands for
    ``job.run_done`` too, listed first in ``skipped``, and carries that run's result.
    """

    run: RunResultData | None = None


class RetryData(EventData):
    """``job.restart_ready``: the job may run again as ``attempt``, but not before ``retry_at``.

    The wait is the site's decision (:mod:`lodestream.schemas.retry`), recorded here so that
    it is visible in the job's history and so that pilots can honour it: none leases the
    job before ``retry_at``. ``max_attempts`` is the budget it was decided with.
    """

    attempt: int = Field(ge=1, le=INT32_MAX)
    reason: str = ""
    work: JobSpec | None = None
    max_attempts: int | None = Field(None, ge=1, le=INT32_MAX)
    backoff_s: float = Field(0.0, ge=0, le=MAX_BACKOFF_S)
    retry_at: AwareDatetime | None = None  # None: at once (what every v1 event meant)


class FailureData(EventData):
    reason: str
    cause: tuple[str, ...] = ()
    parent_id: uuid.UUID | None = None


class ReasonData(EventData):
    reason: str = ""


class CreatedData(JobSpec):
    """``job.created``: the job's spec and, when the API chose its site (``site: "auto"``),
    that choice and the figures it was made on. Events from before ``site_choice`` existed
    decode with None.

    ``skipped`` is :data:`~lodestream.schemas.states.CREATED_RUNNABLE` when the API created
    the job runnable (no parents, nothing to stage, no ``preprocess`` hook at its app):
    the job is PREPROCESSED from its first event and goes straight to the site's pilots on
    ``launch-<site>``. Empty: the controller moves it on, as before.
    """

    site_choice: SiteChoice | None = None
    skipped: tuple[str, ...] = ()


class JobCreated(Event):
    event_type: ClassVar[str] = "job.created"
    type: Literal["job.created"] = "job.created"
    v: Annotated[Literal[2], EXACT_VERSION] = 2
    data: CreatedData

    @property
    def runnable(self) -> bool:
        """Whether it claims to create the job runnable (the fold judges whether it may)."""
        return self.data.skipped == CREATED_RUNNABLE

    @field_validator("data", mode="before")
    @classmethod
    def _from_spec(cls, value: Any) -> Any:
        # A bare JobSpec (the builders of tests and benchmarks) is a job.created whose site
        # was named, not chosen.
        if isinstance(value, JobSpec) and not isinstance(value, CreatedData):
            return dict(value)
        return value


@upcaster("job.created", 1)
def _created_v1(document: dict[str, Any]) -> dict[str, Any]:
    # v2 added data.skipped (a job created runnable); a v1 job was always created CREATED.
    return document


class JobAwaitingParents(Event):
    event_type: ClassVar[str] = "job.awaiting_parents"
    type: Literal["job.awaiting_parents"] = "job.awaiting_parents"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: ParentsData


class JobReady(Event):
    event_type: ClassVar[str] = "job.ready"
    type: Literal["job.ready"] = "job.ready"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: StepData = StepData()


class JobStagedIn(Event):
    event_type: ClassVar[str] = "job.staged_in"
    type: Literal["job.staged_in"] = "job.staged_in"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: StepData = StepData()


class JobPreprocessed(Event):
    event_type: ClassVar[str] = "job.preprocessed"
    type: Literal["job.preprocessed"] = "job.preprocessed"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: StepData = StepData()


class JobLeased(Event):
    event_type: ClassVar[str] = "job.leased"
    type: Literal["job.leased"] = "job.leased"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: LeaseData


class JobLeaseReleased(Event):
    event_type: ClassVar[str] = "job.lease_released"
    type: Literal["job.lease_released"] = "job.lease_released"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: LeaseData


class JobLeaseExpired(Event):
    event_type: ClassVar[str] = "job.lease_expired"
    type: Literal["job.lease_expired"] = "job.lease_expired"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: LeaseData


class JobPlacementRefused(Event):
    """A pilot of the site cannot ever run this job (its nodes are too few or too small, or
    its mode is the other one): ``data.reason`` in the pilot's words, ``data.session_id`` the
    pilot. The job stays runnable: the event carries its work and is delivered to the site's
    pilots again, so a pilot that fits leases it chained on this event. A pilot appends one
    only on a delivery that is not itself a refusal, so a job gets at most one per time it
    becomes runnable, however many pilots refuse it."""

    event_type: ClassVar[str] = "job.placement_refused"
    type: Literal["job.placement_refused"] = "job.placement_refused"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: LeaseData


class JobStarted(Event):
    event_type: ClassVar[str] = "job.started"
    type: Literal["job.started"] = "job.started"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: StartedData


class JobRunDone(Event):
    event_type: ClassVar[str] = "job.run_done"
    type: Literal["job.run_done"] = "job.run_done"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: RunResultData = RunResultData()


class JobRunErrored(Event):
    event_type: ClassVar[str] = "job.run_errored"
    type: Literal["job.run_errored"] = "job.run_errored"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: RunResultData


class JobRunTimedOut(Event):
    event_type: ClassVar[str] = "job.run_timed_out"
    type: Literal["job.run_timed_out"] = "job.run_timed_out"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: RunResultData


class JobPostprocessed(Event):
    event_type: ClassVar[str] = "job.postprocessed"
    type: Literal["job.postprocessed"] = "job.postprocessed"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: StepData = StepData()


class JobRestartReady(Event):
    event_type: ClassVar[str] = "job.restart_ready"
    type: Literal["job.restart_ready"] = "job.restart_ready"
    v: Annotated[Literal[2], EXACT_VERSION] = 2
    data: RetryData


@upcaster("job.restart_ready", 1)
def _restart_ready_v1(document: dict[str, Any]) -> dict[str, Any]:
    # v2 added max_attempts, backoff_s and retry_at; a v1 restart was due at once.
    return document


class JobStagedOut(Event):
    event_type: ClassVar[str] = "job.staged_out"
    type: Literal["job.staged_out"] = "job.staged_out"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: StepData = StepData()


class JobFinished(Event):
    event_type: ClassVar[str] = "job.finished"
    type: Literal["job.finished"] = "job.finished"
    v: Annotated[Literal[2], EXACT_VERSION] = 2
    data: FinishedData = FinishedData()


@upcaster("job.finished", 1)
def _finished_v1(document: dict[str, Any]) -> dict[str, Any]:
    # v2 added data.run (the run's result when the pilot finishes the job); v1 has none.
    return document


class JobFailed(Event):
    event_type: ClassVar[str] = "job.failed"
    type: Literal["job.failed"] = "job.failed"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: FailureData


class JobKilled(Event):
    event_type: ClassVar[str] = "job.killed"
    type: Literal["job.killed"] = "job.killed"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: ReasonData = ReasonData()


class JobReset(Event):
    event_type: ClassVar[str] = "job.reset"
    type: Literal["job.reset"] = "job.reset"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: ReasonData = ReasonData()


JOB_EVENTS: tuple[type[Event], ...] = (
    JobCreated,
    JobAwaitingParents,
    JobReady,
    JobStagedIn,
    JobPreprocessed,
    JobLeased,
    JobLeaseReleased,
    JobLeaseExpired,
    JobPlacementRefused,
    JobStarted,
    JobRunDone,
    JobRunErrored,
    JobRunTimedOut,
    JobPostprocessed,
    JobRestartReady,
    JobStagedOut,
    JobFinished,
    JobFailed,
    JobKilled,
    JobReset,
)
