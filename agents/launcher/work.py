"""Work items: a runnable event delivered on ``launch-<site>``, with what it takes to run it."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from schemas.codec import DecodeError, decode
from schemas.events.job import LeaseData, RetryData, StepData
from schemas.resources import JobSpec

RUNNABLE_EVENTS = ("preprocessed", "restart_ready", "lease_released", "lease_expired")


def launch_filters(site: str) -> list[str]:
    """Subjects of the events that make a job runnable at ``site``."""
    return [f"evt.{site}.job.*.{name}" for name in RUNNABLE_EVENTS]


@dataclass(frozen=True, slots=True)
class WorkItem:
    job_id: uuid.UUID
    seq: int  # stream sequence of the runnable event: the lease chains on it
    spec: JobSpec
    attempt: int
    msg: Any  # the NATS message, acked or nak'ed by the launcher


class NotWork(ValueError):
    """A delivered message that carries no runnable job (malformed, or no work payload)."""


def work_item(msg: Any) -> WorkItem:
    try:
        event = decode(msg.data)
    except DecodeError as exc:
        raise NotWork(str(exc)) from exc
    data = event.data
    if not isinstance(data, StepData | LeaseData | RetryData) or data.work is None:
        raise NotWork(f"{event.type} for {event.aggregate_id} carries no work")
    return WorkItem(
        job_id=event.aggregate_id,
        seq=msg.metadata.sequence.stream,
        spec=data.work,
        attempt=data.attempt,
        msg=msg,
    )
