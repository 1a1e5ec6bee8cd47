"""Request and response bodies: the API's wire formats.

They stay apart from the domain types in ``schemas/`` and convert at the
boundary with named classmethods (``JobOut.from_row``, ``SiteOut.from_row``).
A job submission reuses :class:`~schemas.resources.JobSpec`'s fields and
rules (one definition of a valid job) and adds the client-chosen ``id``.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from lodestream.schemas.events.batch import (
    MAX_OPTIONS,
    BatchRequestData,
    OptionName,
    RenderableValue,
    RenderableWord,
)
from lodestream.schemas.events.job import CreatedData
from lodestream.schemas.events.scaler import (
    ScalerBacklogData,
    ScalerDeletion,
    ScalerLimits,
    ScalerRequest,
    WindowData,
)
from lodestream.schemas.nkey import UserPublicKey
from lodestream.schemas.resources import INT64_MAX, NUL_FREE_PATTERN, TAG_VALUE_MAX_LENGTH
from lodestream.schemas.strategies import AUTO_SITE, DEFAULT_STRATEGY, RESERVED_SITE_NAMES, Strategy
from lodestream.schemas.subjects import SITE_SLUG_PATTERN, check_site

if TYPE_CHECKING:  # the SDK imports these models too, and never needs SQLAlchemy
    from sqlalchemy import RowMapping

TOO_MANY_JOBS: Final = "too_many_jobs"
"""Error type raised while validating a submission with more jobs than allowed (413)."""

MAX_PAGE_SIZE: Final = 1000
"""The most items one page may hold; ``api.max_page_size`` can only lower it."""
SEQ_MAX: Final = INT64_MAX  # stream sequences and offsets are Postgres bigint
MAX_TEXT: Final = 2000
# A tag filter splits at its first ':', so its key cannot hold one (a TagKey may).
TAG_FILTER_MAX_LENGTH: Final = 65 + TAG_VALUE_MAX_LENGTH
TAG_FILTER_PATTERN: Final = rf"^[A-Za-z0-9_.-]{{1,64}}:[^\x00]{{0,{TAG_VALUE_MAX_LENGTH}}}$"

# Free text (a description, a reason) as it reaches text and jsonb columns: bounded, no NUL.
FreeText = Annotated[str, StringConstraints(max_length=MAX_TEXT, pattern=NUL_FREE_PATTERN)]


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON Schema with its ``$defs`` inlined, to embed in an OpenAPI operation."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline(defs[ref.removeprefix("#/$defs/")])
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    result: dict[str, Any] = inline(schema)
    return result


class Wire(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# --- errors ----------------------------------------------------------------------------------


class ErrorInfo(BaseModel):
    code: str = Field(description="stable, machine-readable: invalid, not_found, too_large, ...")
    message: str = Field(description="what is wrong and, where it helps, what to do")
    details: Any = Field(description="per-problem details (e.g. each invalid field), or null")


class ErrorBody(BaseModel):
    """The body of every error response but /readyz's."""

    error: ErrorInfo


# --- submission ----------------------------------------------------------------------------


# A submission is used as the data of its job.created event without a copy (a copy with
# the chosen site for ``site: "auto"``); pydantic serialises a field by its declared type
# (CreatedData), so ``id`` and ``strategy`` are never written to the log.
class JobSubmission(CreatedData):
    """A job to create; ``id`` is optional, so parents and children can go in one request.

    ``site: "auto"`` lets the API choose among the caller's sites that define the app, by
    ``strategy``; the API records the choice in ``site_choice``, which a client cannot set.
    """

    id: uuid.UUID | None = None
    strategy: Strategy | None = Field(
        None, description=f'with site "auto" only; default {DEFAULT_STRATEGY}'
    )
    site_choice: SkipJsonSchema[None] = None
    skipped: SkipJsonSchema[tuple[()]] = ()  # the api's to decide (submit.created_runnable)

    @model_validator(mode="after")
    def _strategy_needs_auto(self) -> JobSubmission:
        if self.strategy is not None and self.site != AUTO_SITE:
            raise ValueError(f'strategy applies only to site "{AUTO_SITE}", not to {self.site!r}')
        return self

    @property
    def auto(self) -> bool:
        """Whether the API must choose this job's site."""
        return self.site == AUTO_SITE


class SubmitRequest(Wire):
    jobs: list[JobSubmission] = Field(
        min_length=1,
        description="at most api.max_jobs_per_request (default 5000) jobs; more is 413",
    )
    idempotency_key: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = None

    @field_validator("jobs", mode="before")
    @classmethod
    def _not_too_many(cls, value: Any, info: ValidationInfo) -> Any:
        # Checked before the items are validated, so an oversized body is refused cheaply.
        limit = (info.context or {}).get("max_jobs")
        if limit is not None and isinstance(value, list) and len(value) > limit:
            raise PydanticCustomError(
                TOO_MANY_JOBS,
                "{count} jobs in one request; the limit is {limit}: split the submission",
                {"count": len(value), "limit": limit},
            )
        return value


class SubmittedJob(Wire):
    id: uuid.UUID
    seq: int
    duplicate: bool


class SubmitResponse(Wire):
    jobs: list[SubmittedJob]
    last_seq: int


# --- jobs and events -------------------------------------------------------------------------


class JobOut(BaseModel):
    id: uuid.UUID
    site: str
    owner: str
    app: str
    state: str
    workdir: str
    parameters: dict[str, Any]
    tags: dict[str, str]
    data: dict[str, Any]
    resources: dict[str, Any]
    transfers: dict[str, Any]
    parent_ids: list[uuid.UUID]
    lease_seq: int | None
    lease_session: uuid.UUID | None
    attempts: int
    return_code: int | None
    last_error: str | None
    created_seq: int
    last_seq: int
    created_at: datetime
    updated_at: datetime
    stage_times: dict[str, datetime]

    @classmethod
    def from_row(cls, row: RowMapping) -> JobOut:
        return cls.model_validate(dict(row))


class TransferItemOut(BaseModel):
    """One transfer item: a slot of a job, moved between the site and one of its locations.

    ``location``, ``remote_path`` and ``recursive`` are the job's ``transfers`` entry for the
    slot; ``local_path`` is the slot's path at the site, relative to its data directory.
    ``attempts`` counts submissions to the transfer backend; ``bytes_transferred`` and
    ``duration_s`` (from the submission that succeeded to its success) are set once it has
    succeeded, ``reason`` and ``permanent`` (retrying could not help) once it has failed.
    ``step_id`` is the event that began the staging step the item was requested for.
    """

    id: uuid.UUID
    job_id: uuid.UUID
    site: str
    slot: str
    direction: str = Field(description="in (stage-in) or out (stage-out)")
    location: str
    remote_path: str
    recursive: bool
    local_path: str
    state: str = Field(description="pending, submitted, succeeded or failed")
    attempts: int
    bytes_transferred: int | None
    duration_s: float | None
    reason: str | None
    permanent: bool
    cached: bool = Field(False, description="served from the site's stage cache: nothing moved")
    task_id: str | None = Field(description="the transfer backend's id of the latest task")
    step_id: uuid.UUID | None
    requested_at: datetime | None
    updated_at: datetime

    @classmethod
    def from_row(cls, row: RowMapping) -> TransferItemOut:
        remote = row["remote"]
        return cls.model_validate({
            **dict(row),
            "location": remote["location"],
            "remote_path": remote["path"],
            "recursive": remote.get("recursive", False),
        })  # fmt: skip


class JobDetail(JobOut):
    """One job, as ``GET /jobs/{id}`` shows it: the fields of a listed job and its transfers.

    ``transfers`` is what the job asked for (slot → location and path); ``transfer_items`` is
    how its staging went: for each slot, the item of the newest staging step. A job reset and
    staged again has items of several steps; the earlier ones are left out (``GET
    /sites/{site}/transfers?job_id=…&state=…`` lists them all). Stage-in slots first, then
    stage-out, each by slot name. Empty for a job that stages nothing or has not reached a
    staging step yet.
    """

    transfer_items: list[TransferItemOut]


class JobPage(BaseModel):
    items: list[JobOut]
    next_offset: int | None = Field(description="offset of the next page; null on the last page")


class JobEventOut(BaseModel):
    seq: int
    job_id: uuid.UUID
    event_id: uuid.UUID
    site: str
    type: str
    from_state: str | None
    to_state: str | None
    occurred_at: datetime
    actor: str
    data: dict[str, Any]

    @classmethod
    def from_row(cls, row: RowMapping) -> JobEventOut:
        return cls.model_validate(dict(row))


class EventPage(BaseModel):
    items: list[JobEventOut]
    next_after_seq: int = Field(
        description="pass as after_seq to continue; it may pass events that are not yours"
    )


# --- sites and apps --------------------------------------------------------------------------


class SiteCreate(Wire):
    # check_site enforces the pattern with a message that states the rule; the schema shows it.
    name: str = Field(json_schema_extra={"pattern": SITE_SLUG_PATTERN})
    description: FreeText = ""
    public_key: UserPublicKey | None = None  # the site's nkey; the seed never leaves the site

    @field_validator("name")
    @classmethod
    def _slug(cls, value: str) -> str:
        # Site names become NATS subject tokens; check_site states the rule in its message.
        check_site(value)
        if value in RESERVED_SITE_NAMES:
            raise ValueError(
                f'{value!r} is reserved: a submission\'s site "{AUTO_SITE}" lets '
                "lodestream choose a site, so no site may be called so"
            )
        return value


class SiteKey(Wire):
    public_key: UserPublicKey


class SiteCreated(Wire):
    name: str
    seq: int


class SiteOut(BaseModel):
    name: str
    description: str
    public_key: str | None
    created_at: datetime
    removed_at: datetime | None
    transfer_locations: dict[str, str] = Field(
        description="the locations the site's transfer module reaches (name → URL), as the "
        "site declared them; a job may stage only through one of them"
    )
    credential_error: str | None = Field(
        None,
        description="why the credential sync left the site's key out of NATS (it cannot "
        "connect until the key is rebound); null when it is applied",
    )

    @classmethod
    def from_row(cls, row: RowMapping, credential_error: str | None = None) -> SiteOut:
        return cls.model_validate({**row, "credential_error": credential_error})


class ScalerDecisionOut(BaseModel):
    """One decision of a site's elastic queue and what it was made from."""

    seq: int
    id: uuid.UUID
    decided_at: datetime
    reason: str
    queued: int
    running: int
    requests: list[ScalerRequest]
    deletions: list[ScalerDeletion]
    backlog_id: uuid.UUID | None
    backlog: ScalerBacklogData | None
    windows: list[WindowData] | None
    limits: ScalerLimits

    @classmethod
    def from_row(cls, row: RowMapping) -> ScalerDecisionOut:
        return cls.model_validate({**dict(row), **row["inputs"]})


class ScalerOut(BaseModel):
    """A site's elastic queue: the newest backlog the control plane told it, its decisions."""

    site: str
    backlog: ScalerBacklogData | None
    backlog_at: datetime | None
    decisions: list[ScalerDecisionOut]


class AppOut(BaseModel):
    site: str
    name: str
    description: str
    parameters: dict[str, Any] = Field(
        description="name → required, default (a JSON value), help, type (str, int, float, "
        "bool, list, dict or any; null: str for a shell app, any for a Python one)"
    )
    transfers: dict[str, Any]
    python: bool
    updated_at: datetime
    version: str = Field("", description="changes with the app's file; '' before versions")
    error: str | None = Field(
        None,
        description="why the app's file no longer loads at its site (file:line: message); "
        "the site runs the last version that loaded. null when it loads",
    )

    @classmethod
    def from_row(cls, row: RowMapping) -> AppOut:
        return cls.model_validate(dict(row))


# --- pilot batch jobs -----------------------------------------------------------------------


class BatchJobCreate(BatchRequestData):
    """A pilot to submit at the site: the request's rules are the event's (one definition).

    ``job_mode`` defaults to ``serial`` here: a pilot that packs single-node jobs on its
    nodes, the common case. ``options`` reach the scheduler only where the site's settings
    allow their names (``scheduler.request_options``); the site refuses the others with
    ``batch.submit_failed``. Queue, project and option values are refused here (422) unless
    each is one word a scheduler reads as data (``RenderableWord``): a space in an option's
    value would otherwise add directives to the pilot's script.
    """

    job_mode: Literal["serial", "mpi"] = "serial"
    queue: RenderableWord = ""
    project: RenderableWord = ""
    options: dict[OptionName, RenderableValue] = Field(default_factory=dict, max_length=MAX_OPTIONS)
    idempotency_key: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = None

    def request(self) -> BatchRequestData:
        return BatchRequestData.model_validate(self.model_dump(exclude={"idempotency_key"}))


class BatchJobAccepted(Wire):
    id: uuid.UUID
    site: str
    state: str
    seq: int
    duplicate: bool = False


class BatchJobOut(BaseModel):
    """A batch job as the read model has it. ``reason`` is the scheduler's word on it: while
    queued, why it waits (Slurm's pending reason: ``Priority``, ``PartitionNodeLimit``, ...);
    once finished or refused, how it ended; after a deletion request, that request's."""

    id: uuid.UUID
    site: str
    state: str
    scheduler: str | None
    scheduler_id: str | None
    scheduler_state: str | None
    num_nodes: int
    wall_time_min: int
    queue: str
    project: str
    job_mode: str
    filter_tags: dict[str, str]
    options: dict[str, str]
    exit_code: int | None
    reason: str | None
    created_at: datetime
    updated_at: datetime
    last_seq: int

    @classmethod
    def from_row(cls, row: RowMapping) -> BatchJobOut:
        return cls.model_validate(dict(row))


# --- health ----------------------------------------------------------------------------------


class Check(BaseModel):
    ok: bool
    detail: str = ""


class ProjectorLag(BaseModel):
    stream_last_seq: int | None
    position: int | None
    lag: int | None


class Readiness(BaseModel):
    ready: bool
    nats: Check
    postgres: Check
    projector: ProjectorLag


class MonitoringKeyIn(Wire):
    public_key: UserPublicKey


class MonitoringKeyOut(Wire):
    """The caller's monitoring key, the sites it may read, and where the log ends now."""

    public_key: str | None
    sites: list[str]
    log_end: int = Field(description="the last stream sequence of the log (0: empty)")
    credential_error: str | None = Field(
        None, description="why the credential sync left this key out of NATS; null if applied"
    )


# --- results ---------------------------------------------------------------------------------

MAX_RESULT_IDS: Final = 5000


class RemoteErrorOut(BaseModel):
    type: str
    message: str
    traceback: str


class JobResultOut(BaseModel):
    """What a job's run came to (``schemas.results``): its state, and once final, how."""

    job_id: uuid.UUID
    site: str
    app: str
    workdir: str
    state: str
    final: bool
    result: Any = Field(None, description="a Python-function app's return value")
    return_code: int | None
    stderr_tail: str
    cause: list[str]
    reason: str
    attempt: int
    runs: int = Field(description="how many runs the job reported, over all attempts")
    error: RemoteErrorOut | None = Field(
        None, description="the exception a Python-function app raised, from its traceback"
    )


class ResultsRequest(Wire):
    ids: list[uuid.UUID] = Field(max_length=MAX_RESULT_IDS)


class ResultsPage(BaseModel):
    position: int = Field(
        description="the log position the results were read at: a feed that starts after it "
        "misses none of these jobs' later events"
    )
    results: list[JobResultOut]
    missing: list[uuid.UUID] = Field(description="ids that are not jobs of yours")
