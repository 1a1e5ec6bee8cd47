"""What the sites provisioned: pilot sessions and the batch jobs they run in, as intervals.

A :class:`SessionInterval` runs from ``session.opened`` (with the nodes the pilot holds) to
``session.closed`` or ``session.expired``; a :class:`BatchInterval` records each step of a
pilot batch job (requested → submitted → queued → running → finished). Times are POSIX
seconds; an end of None means the log read shows no end yet. Batch events are judged by
:func:`lodestream.schemas.batch.next_batch_state`, as the projector judges them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Literal

from lodestream.schemas.envelope import Event
from lodestream.schemas.events.batch import (
    BatchFinishedData,
    BatchJobRequested,
    BatchReasonData,
    BatchSubmittedData,
)
from lodestream.schemas.events.session import SessionOpened
from lodestream.schemas.resources import BatchJobState

SessionEnd = Literal["closed", "expired"]


@dataclass(slots=True)
class SessionInterval:
    """One pilot session: when it opened and ended, and what it held."""

    session_id: uuid.UUID
    site: str
    batch_job_id: uuid.UUID | None
    mode: str
    nodes: int
    cores: int
    gpus: int
    opened_at: float
    opened_seq: int  # the stream sequence of session.opened: the order sessions are listed in
    ended_at: float | None = None
    end: SessionEnd | None = None
    reason: str = ""


@dataclass(slots=True)
class BatchInterval:
    """One pilot batch job: each step's time (None: not reached) and how it ended."""

    batch_id: uuid.UUID
    site: str
    num_nodes: int
    wall_time_min: int
    requested_at: float
    requested_seq: int  # the stream sequence of batch.requested: the order batch jobs are listed in
    state: BatchJobState = BatchJobState.REQUESTED
    submitted_at: float | None = None
    queued_at: float | None = None
    running_at: float | None = None  # the first time the scheduler reported it running
    finished_at: float | None = None  # batch.finished or batch.submit_failed
    scheduler_id: str = ""
    exit_code: int | None = None
    scheduler_state: str = ""
    reason: str = ""


def open_session(seq: int, event: SessionOpened) -> SessionInterval:
    data = event.data
    return SessionInterval(
        session_id=event.aggregate_id,
        site=event.site,
        batch_job_id=data.batch_job_id,
        mode=data.mode,
        nodes=len(data.nodes),
        cores=sum(n.cores for n in data.nodes),
        gpus=sum(n.gpus for n in data.nodes),
        opened_at=event.occurred_at.timestamp(),
        opened_seq=seq,
    )


def end_session(session: SessionInterval, event: Event) -> None:
    """Record ``session.closed`` / ``session.expired``; the first end counts."""
    if session.ended_at is not None:
        return
    session.ended_at = event.occurred_at.timestamp()
    session.end = "expired" if event.type == "session.expired" else "closed"
    session.reason = str(getattr(event.data, "reason", ""))


def request_batch(seq: int, event: BatchJobRequested) -> BatchInterval:
    data = event.data
    return BatchInterval(
        batch_id=event.aggregate_id,
        site=event.site,
        num_nodes=data.num_nodes,
        wall_time_min=data.wall_time_min,
        requested_at=event.occurred_at.timestamp(),
        requested_seq=seq,
    )


def extend_batch(batch: BatchInterval, event: Event, state: BatchJobState) -> None:
    """Record a later batch event, already judged legal (leading to ``state``)."""
    at = event.occurred_at.timestamp()
    batch.state = state
    data = event.data
    match event.type:
        case "batch.submitted":
            if batch.submitted_at is None:
                batch.submitted_at = at
            if isinstance(data, BatchSubmittedData):
                batch.scheduler_id = data.scheduler_id
        case "batch.queued":
            if batch.queued_at is None:
                batch.queued_at = at
        case "batch.running":
            if batch.running_at is None:
                batch.running_at = at
        case "batch.finished" | "batch.submit_failed":
            batch.finished_at = at
            if isinstance(data, BatchFinishedData):
                batch.exit_code = data.exit_code
                batch.scheduler_state = data.state
                batch.reason = data.reason
            elif isinstance(data, BatchReasonData):
                batch.reason = data.reason
