"""Appending ``job.created`` events, and telling a retry from a genuine clash.

A ``job.created`` is appended with ``expect=0`` ("this job must not exist").
When the server refuses one, the job's own ``job.created`` subject says whether
it was this very event (a retry whose first attempt landed; the log is
unchanged and we report the original sequence) or somebody else's job.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.errors import APIError

from lodestream.eventlog import Appended, ConflictError, EventLog
from lodestream.eventlog.append import H_MSG_ID
from schemas.envelope import Event
from schemas.subjects import EVENTS_STREAM


@dataclass(frozen=True, slots=True)
class Accepted:
    id: uuid.UUID
    seq: int
    duplicate: bool


@dataclass(frozen=True, slots=True)
class Refused:
    id: uuid.UUID
    reason: str
    conflict: bool  # the id is taken; otherwise the log did not acknowledge


async def append_created(
    log: EventLog, js: JetStreamContext, events: Sequence[Event]
) -> list[Accepted | Refused]:
    """Append ``events`` (each creating a new aggregate), pipelined; one outcome per event."""
    outcomes: list[Accepted | Refused] = []
    for result in await log.append_many([(event, 0) for event in events]):
        event = result.event
        if isinstance(result, Appended):
            outcomes.append(Accepted(event.aggregate_id, result.seq, result.duplicate))
        elif isinstance(result.error, ConflictError):
            seq = await first_append_of(js, event)
            outcomes.append(
                Accepted(event.aggregate_id, seq, duplicate=True)
                if seq is not None
                else Refused(event.aggregate_id, f"{event.kind} {event.aggregate_id} exists", True)
            )
        else:
            outcomes.append(Refused(event.aggregate_id, str(result.error), conflict=False))
    return outcomes


async def first_append_of(js: JetStreamContext, event: Event) -> int | None:
    """The stream sequence at which ``event`` itself was appended, if it is on its subject."""
    try:
        stored = await js.get_msg(EVENTS_STREAM, subject=event.subject, direct=True)
    except (APIError, NatsTimeoutError):
        return None
    if stored.seq is not None and stored.headers and stored.headers.get(H_MSG_ID) == str(event.id):
        return int(stored.seq)
    return None
