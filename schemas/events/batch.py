"""Pilot batch-job events: requested → submitted → queued → running → finished."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from lodestream.schemas.envelope import Event, EventData
from lodestream.schemas.resources import INT32_MAX, INT32_MIN


class BatchRequestData(EventData):
    num_nodes: int = Field(ge=1, le=INT32_MAX)
    wall_time_min: int = Field(ge=1, le=INT32_MAX)
    queue: str = ""
    project: str = ""
    job_mode: Literal["serial", "mpi"] = "mpi"
    filter_tags: dict[str, str] = Field(default_factory=dict)


class BatchSubmittedData(EventData):
    scheduler_id: str


class BatchFinishedData(EventData):
    exit_code: int | None = Field(None, ge=INT32_MIN, le=INT32_MAX)
    state: str = ""
    reason: str = ""


class BatchReasonData(EventData):
    reason: str = ""


class BatchJobRequested(Event):
    event_type: ClassVar[str] = "batch.requested"
    type: Literal["batch.requested"] = "batch.requested"
    v: Literal[1] = 1
    data: BatchRequestData


class BatchJobSubmitted(Event):
    event_type: ClassVar[str] = "batch.submitted"
    type: Literal["batch.submitted"] = "batch.submitted"
    v: Literal[1] = 1
    data: BatchSubmittedData


class BatchJobQueued(Event):
    event_type: ClassVar[str] = "batch.queued"
    type: Literal["batch.queued"] = "batch.queued"
    v: Literal[1] = 1
    data: BatchReasonData = BatchReasonData()


class BatchJobRunning(Event):
    event_type: ClassVar[str] = "batch.running"
    type: Literal["batch.running"] = "batch.running"
    v: Literal[1] = 1
    data: BatchReasonData = BatchReasonData()


class BatchJobFinished(Event):
    event_type: ClassVar[str] = "batch.finished"
    type: Literal["batch.finished"] = "batch.finished"
    v: Literal[1] = 1
    data: BatchFinishedData


class BatchJobSubmitFailed(Event):
    event_type: ClassVar[str] = "batch.submit_failed"
    type: Literal["batch.submit_failed"] = "batch.submit_failed"
    v: Literal[1] = 1
    data: BatchReasonData


class BatchJobDeletionRequested(Event):
    event_type: ClassVar[str] = "batch.deletion_requested"
    type: Literal["batch.deletion_requested"] = "batch.deletion_requested"
    v: Literal[1] = 1
    data: BatchReasonData = BatchReasonData()


BATCH_EVENTS: tuple[type[Event], ...] = (
    BatchJobRequested,
    BatchJobSubmitted,
    BatchJobQueued,
    BatchJobRunning,
    BatchJobFinished,
    BatchJobSubmitFailed,
    BatchJobDeletionRequested,
)
