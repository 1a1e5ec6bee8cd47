"""Folding events with the projector's in-memory :class:`Projection`, for unit tests."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from lodestream.schemas.codec import encode
from lodestream.schemas.envelope import Event
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.services.projector.messages import EventMessage, RawMessage
from lodestream.services.projector.projection import Changes, Known, Projection

SITE = "alpha"
OWNER = "ada"
SITE_ACTOR = f"site:{SITE}"
SESSION = uuid.UUID("01900000-0000-7000-8000-0000000000a1")
AT = datetime(2025, 1, 2, tzinfo=UTC)
NKEY_USER = "UCHDHJ54QTK6PP5KIZ3IV3UVX5N446PLTFMIPABEPL3NO6LYBLGLJZ2F"


def ev(
    cls: type[Event],
    data: BaseModel | None,
    *,
    actor: str = SITE_ACTOR,
    aggregate: uuid.UUID | None = None,
) -> Event:
    return cls.create(
        site=SITE, aggregate_id=aggregate or uuid.uuid4(), actor=actor, data=data, occurred_at=AT
    )


def fold(projection: Projection, events: list[Event], first_seq: int = 1) -> None:
    for seq, event in enumerate(events, first_seq):
        raw = RawMessage(EVENTS_STREAM, seq, event.subject, encode(event))
        projection.fold(raw, EventMessage(seq, event))


def fresh(*, owned: bool = True) -> Projection:
    return Projection(Known(site_owners={SITE: OWNER} if owned else {}), Changes())


def reasons(projection: Projection) -> list[str]:
    return [row.reason for row in projection.changes.quarantine]


def ops(projection: Projection) -> list[tuple[str, dict[str, Any]]]:
    return [(op.statement, op.params) for op in projection.changes.ops]
