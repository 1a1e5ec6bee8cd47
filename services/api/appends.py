"""Appending ``job.created`` events, and telling a retry from a genuine clash.

A ``job.created`` is appended with ``expect=0`` ("this job must not exist").
When the server refuses one, the job's own ``job.created`` subject says whether
it was this very event (a retry whose first attempt landed; the log is
unchanged and we report the original sequence) or somebody else's job.

Every append the API makes is first measured against the server's
``max_payload`` (:func:`message_size`): a message over it is refused by
nats-py half-way through a pipelined batch (the jobs before it are appended)
and, if it reached the server, would cost the connection. Measured first, an
oversized job refuses the whole request with 413 and nothing is appended.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from lodestream.eventlog import Appended, ConflictError, EventLog
from lodestream.eventlog.wire import Outgoing
from lodestream.schemas.envelope import Event
from lodestream.services.api.errors import TooLarge


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


def message_size(event: Event, expect: int | None) -> int:
    """The bytes the server counts against ``max_payload`` to append ``event``."""
    return Outgoing.of(event, expect).size


def oversized(messages: Sequence[Outgoing], limit: int) -> list[tuple[int, int]]:
    """``(position, bytes)`` of each of ``messages`` that is over ``limit``."""
    return [(position, m.size) for position, m in enumerate(messages) if m.size > limit]


def ensure_fits(event: Event, expect: int | None, limit: int) -> None:
    """Raise TooLarge if ``event`` is over ``limit`` bytes as a message."""
    size = message_size(event, expect)
    if size > limit:
        raise TooLarge(
            f"the {event.type} event would be {size} bytes; the event log accepts at most "
            f"{limit} bytes per event (NATS max_payload)",
            {"limit": limit, "size": size},
        )


async def append_created(log: EventLog, messages: Sequence[Outgoing]) -> list[Accepted | Refused]:
    """Append ``messages`` (each creating a new aggregate, ``expect=0``) pipelined; one
    outcome per message. A retry of one that had landed comes back as an :class:`Appended`
    duplicate (the log recognises it), so a conflict here is another event's."""
    outcomes: list[Accepted | Refused] = []
    for result in await log.append_batch(messages):
        event = result.event
        if isinstance(result, Appended):
            outcomes.append(Accepted(event.aggregate_id, result.seq, result.duplicate))
        elif isinstance(result.error, ConflictError):
            outcomes.append(
                Refused(event.aggregate_id, f"{event.kind} {event.aggregate_id} exists", True)
            )
        else:
            outcomes.append(Refused(event.aggregate_id, str(result.error), conflict=False))
    return outcomes
