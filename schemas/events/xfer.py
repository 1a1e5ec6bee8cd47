"""Transfer-item events: pending → submitted(task id) → succeeded | failed(reason).

The controller requests one item per transfer slot of a job when the job reaches the step
(READY for stage-in, POSTPROCESSED for stage-out); the site's transfer module submits, polls
and reports. An item submitted again after a transient failure appends ``xfer.submitted``
again with the next attempt; ``xfer.failed`` is final.
"""

from __future__ import annotations

import uuid
from typing import Annotated, ClassVar, Literal

from pydantic import Field, StringConstraints

from lodestream.schemas.envelope import EXACT_VERSION, Event, EventData
from lodestream.schemas.resources import (
    INT64_MAX,
    PRINTABLE_PATTERN,
    Overwrite,
    SlotName,
    TransferSpec,
)


class TransferRequestedData(EventData):
    job_id: uuid.UUID
    slot: SlotName
    direction: Literal["in", "out"]
    remote: TransferSpec
    local_path: str  # relative to the site's data directory: the job's workdir and the slot's path
    # The event that began the job's staging step (job.ready, job.reset, job.postprocessed):
    # the step ends when every item requested for it has succeeded.
    step_id: uuid.UUID | None = None
    # The app marks the slot's input cacheable: the site may serve it from its stage cache.
    cache: bool = False
    # The job's ``remote.overwrite``, else the slot's; and whether the slot verifies what it
    # moves (an expected ``remote.sha256`` is checked either way). docs/transfers.md.
    overwrite: Overwrite = "never"
    verify: bool = False


class TransferSubmittedData(EventData):
    task_id: Annotated[
        str, StringConstraints(min_length=1, max_length=256, pattern=PRINTABLE_PATTERN)
    ]
    attempt: int = Field(1, ge=1, le=1000)
    items_in_task: int = Field(1, ge=1, le=100_000)  # the batch it went in, for the analytics


class TransferFailedData(EventData):
    reason: Annotated[str, StringConstraints(max_length=4096)]
    permanent: bool = False  # retrying could not help (no such file, permission denied)
    attempts: int = Field(1, ge=1, le=1000)


class TransferDoneData(EventData):
    bytes_transferred: int | None = Field(None, ge=0, le=INT64_MAX)
    # From the submission that succeeded to its success, as the site saw it.
    duration_s: float | None = Field(None, ge=0, le=1e9, allow_inf_nan=False)
    attempts: int = Field(1, ge=1, le=1000)
    cached: bool = False  # served from the site's stage cache: nothing moved from the location


class TransferRequested(Event):
    event_type: ClassVar[str] = "xfer.requested"
    type: Literal["xfer.requested"] = "xfer.requested"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: TransferRequestedData


class TransferSubmitted(Event):
    event_type: ClassVar[str] = "xfer.submitted"
    type: Literal["xfer.submitted"] = "xfer.submitted"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: TransferSubmittedData


class TransferSucceeded(Event):
    event_type: ClassVar[str] = "xfer.succeeded"
    type: Literal["xfer.succeeded"] = "xfer.succeeded"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: TransferDoneData = TransferDoneData()


class TransferFailed(Event):
    event_type: ClassVar[str] = "xfer.failed"
    type: Literal["xfer.failed"] = "xfer.failed"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: TransferFailedData


XFER_EVENTS: tuple[type[Event], ...] = (
    TransferRequested,
    TransferSubmitted,
    TransferSucceeded,
    TransferFailed,
)
