"""What the projector reads off the streams, decoded and checked against its subject.

A message becomes a :class:`Decoded` (an event, a heartbeat or an expiry
marker) or a :class:`~services.projector.rows.QuarantineRow` with the
reason — never an exception that could stop the projector. The check is
the shared rule of :mod:`lodestream.schemas.trust`, the same one every other consumer
applies.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import Untrusted
from lodestream.schemas.events.session import Heartbeat
from lodestream.schemas.subjects import HB_STREAM
from lodestream.schemas.trust import (
    HeartbeatBeat,
    HeartbeatExpired,
    event_from_message,
    heartbeat_message,
)
from lodestream.services.projector.rows import QuarantineRow


# Not frozen, these two: a frozen dataclass sets each field through object.__setattr__, three
# times the cost of a plain one, and one of each is made for every event read (as rows.py's
# JobEventRow for every job event folded). Nothing changes them after they are made.
@dataclass(slots=True)
class RawMessage:
    stream: str
    seq: int
    subject: str
    data: bytes
    headers: dict[str, str] | None = None


@dataclass(slots=True)
class EventMessage:
    seq: int
    event: Event


@dataclass(frozen=True, slots=True)
class HeartbeatMessage:
    seq: int
    site: str
    session_id: uuid.UUID
    heartbeat: Heartbeat


@dataclass(frozen=True, slots=True)
class ExpiryMarker:
    """The server deleted a heartbeat whose TTL ran out: that launcher is gone."""

    seq: int
    site: str
    session_id: uuid.UUID


Decoded = EventMessage | HeartbeatMessage | ExpiryMarker


def decode_message(raw: RawMessage) -> Decoded | QuarantineRow:
    try:
        if raw.stream == HB_STREAM:
            return _decode_heartbeat(raw)
        return EventMessage(raw.seq, event_from_message(raw.subject, raw.data))
    except Untrusted as exc:
        return QuarantineRow(raw.stream, raw.seq, raw.subject, str(exc), raw.data)


def _decode_heartbeat(raw: RawMessage) -> HeartbeatMessage | ExpiryMarker:
    match heartbeat_message(raw.subject, raw.headers, raw.data):
        case HeartbeatExpired(site=site, session_id=session_id):
            return ExpiryMarker(raw.seq, site, session_id)
        case HeartbeatBeat(site=site, session_id=session_id, heartbeat=heartbeat):
            return HeartbeatMessage(raw.seq, site, session_id, heartbeat)
