"""What the projector reads off the streams, decoded and checked against its subject.

A message becomes a :class:`Decoded` (an event, a heartbeat or an expiry
marker) or a :class:`~services.projector.rows.QuarantineRow` with the
reason — never an exception that could stop the projector.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Final

import orjson
from pydantic import ValidationError

from schemas.codec import DecodeError, decode
from schemas.envelope import Event
from schemas.events.session import Heartbeat
from schemas.subjects import HB_STREAM, SubjectError, check_site, parse_event_subject
from services.projector.rows import QuarantineRow

MARKER_HEADER: Final = "Nats-Marker-Reason"


@dataclass(frozen=True, slots=True)
class RawMessage:
    stream: str
    seq: int
    subject: str
    data: bytes
    headers: dict[str, str] | None = None


@dataclass(frozen=True, slots=True)
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
        return _decode_event(raw)
    except (DecodeError, SubjectError, ValueError) as exc:
        return QuarantineRow(raw.stream, raw.seq, raw.subject, str(exc), raw.data)


def _decode_event(raw: RawMessage) -> EventMessage:
    subject = parse_event_subject(raw.subject)
    event = decode(raw.data)
    if event.site != subject.site:
        raise ValueError(f"event for site {event.site!r} on subject of site {subject.site!r}")
    if event.type != subject.event_type:
        raise ValueError(f"event type {event.type} on subject for {subject.event_type}")
    if str(event.aggregate_id) != subject.aggregate_id:
        raise ValueError(f"aggregate {event.aggregate_id} on subject for {subject.aggregate_id}")
    return EventMessage(raw.seq, event)


def _decode_heartbeat(raw: RawMessage) -> HeartbeatMessage | ExpiryMarker:
    parts = raw.subject.split(".")
    if len(parts) != 3 or parts[0] != "hb":
        raise SubjectError(f"not a heartbeat subject: {raw.subject!r}")
    site = check_site(parts[1])
    session_id = uuid.UUID(parts[2])
    if raw.headers and MARKER_HEADER in raw.headers:
        return ExpiryMarker(raw.seq, site, session_id)
    try:
        heartbeat = Heartbeat.model_validate(orjson.loads(raw.data))
    except (orjson.JSONDecodeError, ValidationError) as exc:
        raise ValueError(f"invalid heartbeat: {exc}") from exc
    if heartbeat.site != site or heartbeat.session_id != session_id:
        raise ValueError("heartbeat body does not match its subject")
    return HeartbeatMessage(raw.seq, site, session_id, heartbeat)
