"""Transfer-item events: pending → submitted(task id) → succeeded | failed(reason)."""

from __future__ import annotations

import uuid
from typing import ClassVar, Literal

from pydantic import Field

from lodestream.schemas.envelope import Event, EventData
from lodestream.schemas.resources import INT64_MAX, SlotName, TransferSpec


class TransferRequestedData(EventData):
    job_id: uuid.UUID
    slot: SlotName
    direction: Literal["in", "out"]
    remote: TransferSpec
    local_path: str


class TransferSubmittedData(EventData):
    task_id: str


class TransferFailedData(EventData):
    reason: str


class TransferDoneData(EventData):
    bytes_transferred: int | None = Field(None, ge=0, le=INT64_MAX)


class TransferRequested(Event):
    event_type: ClassVar[str] = "xfer.requested"
    type: Literal["xfer.requested"] = "xfer.requested"
    v: Literal[1] = 1
    data: TransferRequestedData


class TransferSubmitted(Event):
    event_type: ClassVar[str] = "xfer.submitted"
    type: Literal["xfer.submitted"] = "xfer.submitted"
    v: Literal[1] = 1
    data: TransferSubmittedData


class TransferSucceeded(Event):
    event_type: ClassVar[str] = "xfer.succeeded"
    type: Literal["xfer.succeeded"] = "xfer.succeeded"
    v: Literal[1] = 1
    data: TransferDoneData = TransferDoneData()


class TransferFailed(Event):
    event_type: ClassVar[str] = "xfer.failed"
    type: Literal["xfer.failed"] = "xfer.failed"
    v: Literal[1] = 1
    data: TransferFailedData


XFER_EVENTS: tuple[type[Event], ...] = (
    TransferRequested,
    TransferSubmitted,
    TransferSucceeded,
    TransferFailed,
)
