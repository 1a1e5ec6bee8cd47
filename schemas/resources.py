"""Resource models: what a user asks for and what the read models show.

``JobSpec`` carries Balsam's resource vocabulary so that applications and
launch commands written for Balsam translate one to one.
"""

from __future__ import annotations

import uuid
from enum import StrEnum
from typing import Annotated, Any, NamedTuple

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints, field_validator

from schemas.subjects import SiteSlug

AppName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,79}$")]
TagKey = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")]
TagValue = Annotated[str, StringConstraints(max_length=256)]
SlotName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")]

MAX_PARENTS = 1000


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TransferSpec(Frozen):
    """A concrete file or directory to stage through one of the app's transfer slots."""

    location: Annotated[str, StringConstraints(min_length=1, max_length=512)]
    path: Annotated[str, StringConstraints(min_length=1, max_length=4096)]
    recursive: bool = False


class JobResources(Frozen):
    num_nodes: int = Field(1, ge=1, le=100_000)
    ranks_per_node: int = Field(1, ge=1, le=4096)
    threads_per_rank: int = Field(1, ge=1, le=4096)
    threads_per_core: int = Field(1, ge=1, le=8)
    gpus_per_rank: int = Field(0, ge=0, le=64)
    node_packing_count: int = Field(1, ge=1, le=4096)
    launch_params: dict[str, str] = Field(default_factory=dict)
    wall_time_min: int = Field(0, ge=0, le=60 * 24 * 30)


class JobSpec(JobResources):
    """A job as submitted: which app at which site, with what, in which workdir."""

    site: SiteSlug
    app: AppName
    workdir: Annotated[str, StringConstraints(min_length=1, max_length=1024)]
    parameters: dict[str, str] = Field(default_factory=dict)
    tags: dict[TagKey, TagValue] = Field(default_factory=dict)
    parent_ids: tuple[uuid.UUID, ...] = Field(default=(), max_length=MAX_PARENTS)
    data: dict[str, Any] = Field(default_factory=dict)
    transfers: dict[SlotName, TransferSpec] = Field(default_factory=dict)

    @field_validator("workdir")
    @classmethod
    def _relative_workdir(cls, value: str) -> str:
        # The site joins workdir under its own data/ directory; escaping it would let a
        # submission write anywhere the site user can. (String tests, not PurePosixPath: this
        # runs for every event decoded anywhere, and they mean the same for POSIX paths.)
        if value.startswith("/") or ".." in value.split("/") or "\x00" in value:
            raise ValueError("workdir must be a relative path without '..'")
        return value

    @field_validator("parent_ids")
    @classmethod
    def _unique_parents(cls, value: tuple[uuid.UUID, ...]) -> tuple[uuid.UUID, ...]:
        if len(set(value)) != len(value):
            raise ValueError("parent_ids contains duplicates")
        return value


class Site(Frozen):
    name: SiteSlug
    owner: str
    description: str = ""
    public_key: str | None = None
    created_at: AwareDatetime


class AppParameter(Frozen):
    required: bool = True
    default: str | None = None
    help: str = ""


class AppTransferSlot(Frozen):
    direction: Annotated[str, StringConstraints(pattern=r"^(in|out)$")]
    local_path: str
    required: bool = False
    recursive: bool = False
    description: str = ""


AppHook = Annotated[
    str, StringConstraints(pattern=r"^(preprocess|postprocess|handle_error|handle_timeout)$")
]


class App(Frozen):
    """What the API knows of an ApplicationDefinition: its name and interface, never its command."""

    site: SiteSlug
    name: AppName
    description: str = ""
    parameters: dict[str, AppParameter] = Field(default_factory=dict)
    transfers: dict[SlotName, AppTransferSlot] = Field(default_factory=dict)
    python: bool = False
    hooks: tuple[AppHook, ...] = ()  # which site-side hooks the app defines

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


class BatchJob(Frozen):
    id: uuid.UUID
    site: SiteSlug
    num_nodes: int = Field(ge=1)
    wall_time_min: int = Field(ge=1)
    queue: str = ""
    project: str = ""
    job_mode: Annotated[str, StringConstraints(pattern=r"^(serial|mpi)$")] = "mpi"
    scheduler_id: str | None = None
    state: BatchJobState = BatchJobState.REQUESTED


class NodeInfo(Frozen):
    hostname: str
    cores: int = Field(ge=1)
    gpus: int = Field(0, ge=0)


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
    local_path: str
    state: TransferState = TransferState.PENDING
    task_id: str | None = None
