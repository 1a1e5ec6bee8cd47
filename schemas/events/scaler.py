"""Elastic queue events: what the control plane sees of a site's backlog, what the site decided.

One ``scaler`` aggregate per site (:func:`scaler_id`), two event types on it:

* ``scaler.backlog`` (control plane): the site's runnable backlog and its open batch jobs, as
  the read models held them at stream sequence ``as_of_seq``. Sites cannot read Postgres; this
  is how the backlog reaches them. The controller appends one when it changed.
* ``scaler.decided`` (site): one decision of the site's elastic queue, with every input it was
  made from (the backlog event, the backfill windows, the limits and, in ``occurred_at``, the
  clock), what it requested and what it deleted. The batch jobs it requests and deletes follow
  as ``batch.requested`` / ``batch.deletion_requested`` with ids derived from the decision.

The limits and the request shape are wire models here, so that a decision on the log can be
replayed: the site's policy is a pure function of exactly what the event records.
"""

from __future__ import annotations

import uuid
from typing import Annotated, ClassVar, Final, Literal, Self

from pydantic import AwareDatetime, Field, StringConstraints, model_validator

from lodestream.schemas.envelope import EXACT_VERSION, Event, EventData
from lodestream.schemas.events.batch import BatchRequestData
from lodestream.schemas.ids import derived_id
from lodestream.schemas.resources import INT32_MAX, INT64_MAX, NUL_FREE_PATTERN

MAX_BACKLOG_BATCH_JOBS: Final = 1000
"""The open batch jobs a backlog lists at most (the newest; see the controller)."""
MAX_NODES: Final = 1_000_000
MAX_WALL_TIME_MIN: Final = 60 * 24 * 365

Text = Annotated[str, StringConstraints(pattern=NUL_FREE_PATTERN)]
# A queue or project becomes one word of a scheduler's command line and a script directive.
SchedulerWord = Annotated[
    str, StringConstraints(max_length=256, pattern=r"^(?:[A-Za-z0-9_][A-Za-z0-9_.:@+=/-]*)?$")
]
OpenBatchState = Literal["requested", "submitted", "queued", "running"]


def scaler_id(site: str) -> uuid.UUID:
    """The id of ``site``'s scaler aggregate: ``evt.<site>.scaler.<id>.*``."""
    return derived_id("scaler", site)


class ScalerBatchJob(EventData):
    """One of the site's batch jobs that has not ended, as the read model shows it."""

    id: uuid.UUID
    state: OpenBatchState
    num_nodes: int = Field(ge=1, le=INT32_MAX)
    wall_time_min: int = Field(ge=1, le=INT32_MAX)
    queue: Text = ""
    requested_at: AwareDatetime
    elastic: bool = False  # requested by the site's elastic queue, which may delete it


class ScalerBacklogData(EventData):
    """The runnable jobs of a site that no pilot holds, and the site's open batch jobs.

    ``node_footprint`` is the sum of num_nodes / node_packing_count over those jobs: the nodes they
    need at once. ``node_minutes`` weights each by its wall time; ``max_wall_time_min`` is the
    longest (0: no job says). Everything was read after the projector had applied
    ``as_of_seq``.
    """

    as_of_seq: int = Field(ge=0, le=INT64_MAX)
    runnable_jobs: int = Field(0, ge=0, le=INT64_MAX)
    node_footprint: float = Field(0.0, ge=0, le=1e15, allow_inf_nan=False)
    node_minutes: float = Field(0.0, ge=0, le=1e18, allow_inf_nan=False)
    max_wall_time_min: int = Field(0, ge=0, le=INT32_MAX)
    batch_jobs: tuple[ScalerBatchJob, ...] = Field((), max_length=MAX_BACKLOG_BATCH_JOBS)

    def same_as(self, other: ScalerBacklogData | None) -> bool:
        """Equal but for ``as_of_seq``: nothing a site decides on has changed."""
        return other is not None and self.model_copy(update={"as_of_seq": 0}) == (
            other.model_copy(update={"as_of_seq": 0})
        )


class ScalerLimits(EventData):
    """The elastic queue's policy settings (``elastic:`` in a site's settings.yml)."""

    queue: SchedulerWord = ""
    project: SchedulerWord = ""
    job_mode: Literal["serial", "mpi"] = "mpi"
    min_nodes: int = Field(1, ge=1, le=MAX_NODES)
    max_nodes: int = Field(1, ge=1, le=MAX_NODES)
    min_wall_time_min: int = Field(30, ge=1, le=MAX_WALL_TIME_MIN)
    max_wall_time_min: int = Field(60, ge=1, le=MAX_WALL_TIME_MIN)
    wall_time_pad_min: int = Field(5, ge=0, le=MAX_WALL_TIME_MIN)
    max_queued_jobs: int = Field(1, ge=1, le=10_000)
    max_queue_wait_min: int | None = Field(None, ge=1, le=MAX_WALL_TIME_MIN)
    use_backfill: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.min_nodes > self.max_nodes:
            raise ValueError(
                f"min_nodes ({self.min_nodes}) is more than max_nodes ({self.max_nodes})"
            )
        if self.min_wall_time_min > self.max_wall_time_min:
            raise ValueError(
                f"min_wall_time_min ({self.min_wall_time_min}) is more than "
                f"max_wall_time_min ({self.max_wall_time_min})"
            )
        if self.use_backfill and not self.queue:
            raise ValueError("use_backfill needs a queue: backfill windows are per queue")
        return self


class WindowData(EventData):
    """A backfill window as the scheduler reported it (``minutes`` None: no known limit)."""

    queue: Text
    nodes: int = Field(ge=0, le=MAX_NODES)
    minutes: int | None = Field(None, ge=0, le=INT32_MAX)


class ScalerRequest(EventData):
    """A batch job the decision requests, and the backfill window it was fitted to."""

    batch_job_id: uuid.UUID
    request: BatchRequestData
    window: WindowData | None = None


class ScalerDeletion(EventData):
    batch_job_id: uuid.UUID
    reason: Text = ""


class ScalerDecidedData(EventData):
    """One decision and everything it was made from; ``occurred_at`` is its clock."""

    backlog_id: uuid.UUID | None = None  # the scaler.backlog event it decided on
    backlog: ScalerBacklogData | None = None
    windows: tuple[WindowData, ...] | None = Field(None, max_length=10_000)  # None: not asked
    limits: ScalerLimits
    queued: int = Field(0, ge=0, le=INT64_MAX)
    running: int = Field(0, ge=0, le=INT64_MAX)
    requests: tuple[ScalerRequest, ...] = Field((), max_length=10_000)
    deletions: tuple[ScalerDeletion, ...] = Field((), max_length=MAX_BACKLOG_BATCH_JOBS)
    reason: Text = ""


class ScalerBacklog(Event):
    event_type: ClassVar[str] = "scaler.backlog"
    type: Literal["scaler.backlog"] = "scaler.backlog"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: ScalerBacklogData


class ScalerDecided(Event):
    event_type: ClassVar[str] = "scaler.decided"
    type: Literal["scaler.decided"] = "scaler.decided"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: ScalerDecidedData


SCALER_EVENTS: tuple[type[Event], ...] = (ScalerBacklog, ScalerDecided)
