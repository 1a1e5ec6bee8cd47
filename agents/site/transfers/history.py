"""A transfer item as the log has it, read with the one read a site key may make.

The newest event of each of the item's subjects (one per event type), by direct get, folded
in sequence order: what was requested, the last submission (task id, attempt) and whether it
has already ended. A delivery redelivered to the next agent (the first died holding it) is
resumed from here, so a task already submitted is polled, not submitted again.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from lodestream.agents.site.newest import newest_event
from lodestream.schemas.envelope import Event
from lodestream.schemas.events import (
    TransferFailed,
    TransferRequested,
    TransferSubmitted,
    TransferSucceeded,
)
from lodestream.schemas.events.xfer import TransferRequestedData
from lodestream.schemas.subjects import event_subject
from lodestream.schemas.xfer import XFER_TRANSITIONS


@dataclass(frozen=True, slots=True)
class ItemView:
    id: uuid.UUID
    request: TransferRequestedData
    last_seq: int
    final: bool = False
    task_id: str | None = None
    attempt: int = 0  # submissions so far
    submitted_at: datetime | None = None  # of the newest submission
    request_id: uuid.UUID | None = None  # the xfer.requested event: what every report follows


def fold_item(events: list[tuple[int, Event]]) -> ItemView | None:
    """The item's view from its newest events; None without its request."""
    view: ItemView | None = None
    for seq, event in sorted(events, key=lambda pair: pair[0]):
        match event:
            case TransferRequested(data=data):
                view = ItemView(event.aggregate_id, data, seq, request_id=event.id)
            case TransferSubmitted(data=data) if view is not None:
                view = replace(view, last_seq=seq, task_id=data.task_id, attempt=data.attempt,
                               submitted_at=event.occurred_at)  # fmt: skip
            case TransferSucceeded() | TransferFailed() if view is not None:
                view = replace(view, last_seq=seq, final=True)
    return view


async def read_item(js: Any, site: str, item: uuid.UUID) -> ItemView | None:
    """The item's view from the log; None if it was never requested. NATS errors raise."""
    subjects = [event_subject(site, event_type, item) for event_type in XFER_TRANSITIONS]
    found = await asyncio.gather(*(newest_event(js, subject, site) for subject in subjects))
    return fold_item([pair for pair in found if pair is not None])
