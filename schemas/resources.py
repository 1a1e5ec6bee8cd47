"""Resource models: what a user asks for and what the read models show.

``JobSpec`` carries Balsam's resource vocabulary so that applications and
launch commands written for Balsam translate one to one.

Whatever these models accept, Postgres can store (docs/architecture.md §7): no
string holds NUL (text and jsonb refuse it), integers that reach an integer
column fit its type, and the free-form JSON of ``data`` holds only signed
64-bit integers and finite numbers (the codec would read anything else back
as a different value). Plain string fields say so with a pattern, which
pydantic checks in Rust and JSON Schema shows; ``data`` and ``parameters``,
the free-form trees, are walked once in Python.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Annotated, Any, Final, Literal, NamedTuple, Self

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StringConstraints,
    field_validator,
    model_validator,
)

from lodestream.schemas import storable
from lodestream.schemas.params import MAX_CALLS, MAX_PARAMETERS_BYTES, ParamType
from lodestream.schemas.subjects import SiteSlug

NUL_FREE_PATTERN: Final = r"^[^\x00]*$"
PRINTABLE_PATTERN: Final = r"^[^\x00-\x1f\x7f-\x9f]*$"  # no control character (Unicode Cc)
APP_NAME_PATTERN: Final = r"^[A-Za-z_][A-Za-z0-9_.-]{0,79}$"
TAG_KEY_PATTERN: Final = r"^[A-Za-z0-9_.:-]{1,64}$"
TAG_VALUE_MAX_LENGTH: Final = 256
# A job's launch_params reach the site's app launcher (srun, mpiexec, ...) as argv words, and
# some launchers hand their arguments on to a remote shell (Hydra over ssh). So a key is an
# option as written on a command line, and a value is one word of characters no shell or
# launcher treats as syntax, never starting with '-' (it would be read as another option when
# a launcher takes the value as the next word); '' makes a switch. What a backend accepts
# beyond this is its own table's business (platform_adapters/launchers/options.py).
LAUNCH_KEY_PATTERN: Final = r"^-{1,2}[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
LAUNCH_VALUE_PATTERN: Final = r"^(?:[A-Za-z0-9_.,:=+/@%][A-Za-z0-9_.,:=+/@%-]{0,255})?$"
MAX_LAUNCH_PARAMS: Final = 32
INT32_MAX: Final = 2**31 - 1  # Postgres integer
INT32_MIN: Final = -(2**31)
INT64_MIN: Final = storable.INT64_MIN  # Postgres bigint, and what the codec reads back as an int
INT64_MAX: Final = storable.INT64_MAX
check_storable: Final = storable.check_storable  # where the read models have always found it

Text = Annotated[str, StringConstraints(pattern=NUL_FREE_PATTERN)]
AppName = Annotated[str, StringConstraints(pattern=APP_NAME_PATTERN)]
TagKey = Annotated[str, StringConstraints(pattern=TAG_KEY_PATTERN)]
LaunchKey = Annotated[str, StringConstraints(pattern=LAUNCH_KEY_PATTERN)]
LaunchValue = Annotated[str, StringConstraints(pattern=LAUNCH_VALUE_PATTERN)]
TagValue = Annotated[
    str, StringConstraints(max_length=TAG_VALUE_MAX_LENGTH, pattern=NUL_FREE_PATTERN)
]
SlotName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")]
# A transfer location's name as a site declares it (``settings.yml`` ``transfers.locations``)
# and its URL; the scheme picks the backend that moves data to and from it.
LocationName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")]
LocationUrl = Annotated[
    str,
    StringConstraints(max_length=1024, pattern=r"^(globus|rsync|local):[^\x00-\x1f\x7f-\x9f]*$"),
]

# A workdir is joined under the site's own data/ directory: it must be relative ('/…' is
# absolute), no component may be '..' (that would let a submission write anywhere the site
# user can), and it must name something below data/ ('.', './/.' name data/ itself, shared
# by every job and cleaned up with one). Written as a pattern, from its components, so that
# pydantic checks it in Rust on every decode and JSON Schema shows it.
_PATH_CHAR = r"[^/\x00-\x1f\x7f-\x9f]"  # printable (no control character), not a separator
_NON_DOT = r"[^./\x00-\x1f\x7f-\x9f]"
_NAMED_PART = rf"(?:{_NON_DOT}{_PATH_CHAR}*|\.(?:{_NON_DOT}{_PATH_CHAR}*|\.{_PATH_CHAR}+))"
_ANY_PART_BUT_UP = (
    rf"(?:{_NAMED_PART}|\.)?"  # a named part, '.', or '' (from '//' or a '/' at the end)
)
_LEADING_DOTS = r"(?:\.(?:/\.?)*/)?"  # './', './/', './././' … before the first named part
WORKDIR_PATTERN: Final = rf"^{_LEADING_DOTS}{_NAMED_PART}(?:/{_ANY_PART_BUT_UP})*$"
Workdir = Annotated[str, StringConstraints(min_length=1, max_length=1024, pattern=WORKDIR_PATTERN)]

MAX_PARENTS = 1000


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


Overwrite = Literal["never", "always", "if-newer"]


class TransferSpec(Frozen):
    """A concrete file or directory to stage through one of the app's transfer slots."""

    location: Annotated[
        str, StringConstraints(min_length=1, max_length=512, pattern=NUL_FREE_PATTERN)
    ]
    path: Annotated[str, StringConstraints(min_length=1, max_length=4096, pattern=NUL_FREE_PATTERN)]
    recursive: bool = False
    # What to do with a destination that exists (docs/transfers.md, "Overwrite"); None: the
    # app's slot decides.
    overwrite: Overwrite | None = None
    # The file's expected SHA-256: the item fails, naming both digests, when it differs.
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] | None = None

    @model_validator(mode="after")
    def _digest_of_a_file(self) -> TransferSpec:
        if self.sha256 is not None and self.recursive:
            raise ValueError("sha256 names one file's digest; a recursive item has none")
        return self


class JobResources(Frozen):
    num_nodes: int = Field(1, ge=1, le=100_000)
    ranks_per_node: int = Field(1, ge=1, le=4096)
    threads_per_rank: int = Field(1, ge=1, le=4096)
    threads_per_core: int = Field(1, ge=1, le=8)
    gpus_per_rank: int = Field(0, ge=0, le=64)
    node_packing_count: int = Field(1, ge=1, le=4096)
    launch_params: dict[LaunchKey, LaunchValue] = Field(
        default_factory=dict, max_length=MAX_LAUNCH_PARAMS
    )
    wall_time_min: int = Field(0, ge=0, le=60 * 24 * 30)


class JobSpec(JobResources):
    """A job as submitted: which app at which site, with what, in which workdir."""

    site: SiteSlug
    app: AppName
    workdir: Workdir
    parameters: dict[Text, JsonValue] = Field(
        default_factory=dict,
        description="JSON values: a Python-function app's run() receives them as they are, a "
        f"shell app renders each as one word; at most {MAX_PARAMETERS_BYTES} bytes as JSON",
    )
    calls: tuple[dict[Text, JsonValue], ...] = Field(
        default=(),
        max_length=MAX_CALLS,
        description="A Python-function app's run() called once per entry, in order, each "
        "entry its parameters (in place of parameters); the job's result is one outcome per "
        f"call; together at most {MAX_PARAMETERS_BYTES} bytes as JSON",
    )
    tags: dict[TagKey, TagValue] = Field(default_factory=dict)
    parent_ids: tuple[uuid.UUID, ...] = Field(
        default=(), max_length=MAX_PARENTS, json_schema_extra={"uniqueItems": True}
    )
    data: dict[Text, Any] = Field(default_factory=dict)
    transfers: dict[SlotName, TransferSpec] = Field(default_factory=dict)

    @field_validator("data")
    @classmethod
    def _storable_data(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_storable(value, "data")
        return value

    @field_validator("parameters")
    @classmethod
    def _storable_parameters(cls, value: dict[str, JsonValue]) -> dict[str, JsonValue]:
        if not value:
            return value
        check_storable(value, "parameters")
        _check_size(value, "parameters", "put bulk input in a file the job stages in")
        return value

    @field_validator("calls")
    @classmethod
    def _storable_calls(
        cls, value: tuple[dict[str, JsonValue], ...]
    ) -> tuple[dict[str, JsonValue], ...]:
        if not value:
            return value
        for call in value:
            check_storable(call, "calls")
        _check_size(value, "calls", "fewer calls a job, or bulk input in a file the job stages in")
        return value

    @model_validator(mode="after")
    def _calls_or_parameters(self) -> Self:
        if self.calls and self.parameters:
            raise ValueError("a job has parameters or calls (one parameter set per call), not both")
        return self

    @property
    def call_count(self) -> int:
        """How many times the app's run() is called: once, or once per entry of ``calls``."""
        return len(self.calls) or 1

    @field_validator("parent_ids")
    @classmethod
    def _unique_parents(cls, value: tuple[uuid.UUID, ...]) -> tuple[uuid.UUID, ...]:
        if len(set(value)) != len(value):
            raise ValueError("parent_ids contains duplicates")
        return value


def _check_size(value: object, what: str, instead: str) -> None:
    """A job's values travel in every event that carries its spec: kept small."""
    size = len(json.dumps(value, separators=(",", ":")).encode())
    if size > MAX_PARAMETERS_BYTES:
        raise ValueError(
            f"{what} take {size} bytes as JSON; the limit is {MAX_PARAMETERS_BYTES} ({instead})"
        )


class Site(Frozen):
    name: SiteSlug
    owner: Text
    description: Text = ""
    public_key: Text | None = None
    created_at: AwareDatetime


class AppParameter(Frozen):
    """One parameter of an app; ``type`` None (apps registered before types) means the
    default of the app's kind (``schemas.params.default_type``)."""

    required: bool = True
    default: JsonValue = None
    help: Text = ""
    type: ParamType | None = None

    @field_validator("default")
    @classmethod
    def _storable_default(cls, value: JsonValue) -> JsonValue:
        check_storable([value], "default")
        return value


class AppTransferSlot(Frozen):
    direction: Annotated[str, StringConstraints(pattern=r"^(in|out)$")]
    local_path: Text
    required: bool = False
    recursive: bool = False
    description: Text = ""
    # An input pilots may keep in their nodes' caches and offer to later jobs that name the
    # same source (docs/platforms.md, "Node-local caches and data-aware dispatch").
    cache: bool = False
    # docs/transfers.md, "Overwrite" and "Integrity": a job's TransferSpec may override
    # ``overwrite``; ``verify`` checks every file moved through the slot.
    overwrite: Overwrite = "never"
    verify: bool = False


AppHook = Annotated[
    str, StringConstraints(pattern=r"^(preprocess|postprocess|handle_error|handle_timeout)$")
]


class App(Frozen):
    """What the API knows of an ApplicationDefinition: its name and interface, never its command."""

    site: SiteSlug
    name: AppName
    description: Text = ""
    parameters: dict[Text, AppParameter] = Field(default_factory=dict)
    transfers: dict[SlotName, AppTransferSlot] = Field(default_factory=dict)
    python: bool = False
    hooks: tuple[AppHook, ...] = ()  # which site-side hooks the app defines
    # Changes with the app's file (its content and its interface); "" before versions.
    version: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{0,64}$")] = ""

    def steps(self, job: JobSpec) -> JobSteps:
        """Which of the optional steps ``job`` goes through at this app."""
        slots = [self.transfers[s] for s in job.transfers if s in self.transfers]
        return JobSteps(
            stage_in=any(slot.direction == "in" for slot in slots),
            preprocess="preprocess" in self.hooks,
            postprocess="postprocess" in self.hooks,
            stage_out=any(slot.direction == "out" for slot in slots),
        )


class JobSteps(NamedTuple):
    """The optional steps of a job; a step that is False is skipped, not performed empty."""

    stage_in: bool = False
    preprocess: bool = False
    postprocess: bool = False
    stage_out: bool = False

    @property
    def nothing_after_run(self) -> bool:
        """A successful run ends the job (the pilot finishes it in the event it reports)."""
        return not (self.postprocess or self.stage_out)


class BatchJobState(StrEnum):
    REQUESTED = "requested"
    SUBMITTED = "submitted"
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    SUBMIT_FAILED = "submit_failed"
    DELETION_REQUESTED = "deletion_requested"


class SchedulerState(StrEnum):
    """A batch job as its scheduler reports it, whatever the scheduler (Slurm, PBS, LSF, ...).

    Every scheduler adapter maps its native states through one table onto these. They are what
    the scheduler says, not the batch-job aggregate's lifecycle (``BatchJobState``): the site
    agent turns them into ``batch.queued`` / ``batch.running`` / ``batch.finished`` events
    (``BATCH_STATE_FOR_SCHEDULER_STATE``), and a final one goes into ``batch.finished``'s
    ``state``. A refused submission is not a state: ``submit`` raises, and the agent appends
    ``batch.submit_failed``. Wall-time expiry is its own final state, not a failure: the pilot
    ran out of time, which is how pilots normally end.
    """

    QUEUED = "queued"  # waiting, held, or requeued: not started (again) yet
    RUNNING = "running"  # allocated: starting, running, suspended after start, or exiting
    FINISHED = "finished"  # ended by itself with status 0
    FAILED = "failed"  # ended with a non-zero status, or by a node/boot/scheduler failure
    CANCELLED = "cancelled"  # deleted by its owner or an administrator
    WALLTIME_EXPIRED = "walltime_expired"  # killed at its wall-time limit
    UNKNOWN = "unknown"  # a native state the adapter's table does not know (logged)


FINAL_SCHEDULER_STATES: Final[frozenset[SchedulerState]] = frozenset({
    SchedulerState.FINISHED,
    SchedulerState.FAILED,
    SchedulerState.CANCELLED,
    SchedulerState.WALLTIME_EXPIRED,
})  # fmt: skip

# What the site agent appends when the scheduler reports a state; None: nothing to append.
_BatchStateTable = Mapping[SchedulerState, BatchJobState | None]
BATCH_STATE_FOR_SCHEDULER_STATE: Final[_BatchStateTable] = MappingProxyType({
    SchedulerState.QUEUED: BatchJobState.QUEUED,
    SchedulerState.RUNNING: BatchJobState.RUNNING,
    SchedulerState.FINISHED: BatchJobState.FINISHED,
    SchedulerState.FAILED: BatchJobState.FINISHED,
    SchedulerState.CANCELLED: BatchJobState.FINISHED,
    SchedulerState.WALLTIME_EXPIRED: BatchJobState.FINISHED,
    SchedulerState.UNKNOWN: None,
})  # fmt: skip


class BatchJob(Frozen):
    id: uuid.UUID
    site: SiteSlug
    num_nodes: int = Field(ge=1, le=INT32_MAX)
    wall_time_min: int = Field(ge=1, le=INT32_MAX)
    queue: Text = ""
    project: Text = ""
    job_mode: Annotated[str, StringConstraints(pattern=r"^(serial|mpi)$")] = "mpi"
    scheduler_id: Text | None = None
    state: BatchJobState = BatchJobState.REQUESTED


class NodeInfo(Frozen):
    hostname: Text
    cores: int = Field(ge=1, le=INT32_MAX)
    gpus: int = Field(0, ge=0, le=INT32_MAX)


class Session(Frozen):
    id: uuid.UUID
    site: SiteSlug
    batch_job_id: uuid.UUID | None = None
    nodes: tuple[NodeInfo, ...] = ()
    deadline: AwareDatetime | None = None
    last_heartbeat: AwareDatetime | None = None


class TransferState(StrEnum):
    PENDING = "pending"
    SUBMITTED = "submitted"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class TransferItem(Frozen):
    id: uuid.UUID
    site: SiteSlug
    job_id: uuid.UUID
    slot: SlotName
    direction: Annotated[str, StringConstraints(pattern=r"^(in|out)$")]
    remote: TransferSpec
    local_path: Text
    state: TransferState = TransferState.PENDING
    task_id: Text | None = None
