"""Forged events, as site beta's attacker writes them: valid JSON envelopes with chosen fields.

The project's event models are used only as a typing aid to spell the JSON (and
:func:`raw_event` spells what they would refuse); nothing is checked against the subject
it is published on, which is the point.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from lodestream.schemas.envelope import Event
from lodestream.schemas.resources import JobSpec


def forged(
    kind: type[Event],
    *,
    site: str,
    aggregate_id: uuid.UUID,
    actor: str,
    data: BaseModel | None = None,
) -> bytes:
    """The JSON of a ``kind`` event that claims ``site`` and ``actor``."""
    event = kind.create(site=site, aggregate_id=aggregate_id, actor=actor, data=data)
    return event.model_dump_json().encode()


def raw_event(
    event_type: str, *, site: str, aggregate_id: uuid.UUID, actor: str, data: dict[str, Any]
) -> dict[str, Any]:
    """An envelope as plain JSON, for payloads no event model would let one build."""
    return {
        "id": str(uuid.uuid4()), "type": event_type, "v": 1, "site": site,
        "aggregate_id": str(aggregate_id), "occurred_at": datetime.now(UTC).isoformat(),
        "actor": actor, "data": data,
    }  # fmt: skip


def spec(site: str, **fields: Any) -> JobSpec:
    return JobSpec.model_validate({"site": site, "app": "hello", "workdir": "w"} | fields)


def subject(site: str, event_type: str, aggregate_id: uuid.UUID | str) -> str:
    kind, _, name = event_type.partition(".")
    return f"evt.{site}.{kind}.{aggregate_id}.{name}"
