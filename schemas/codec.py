"""Wire codec: event ⇄ bytes, with upcasting of old versions on the way in.

Decoding is one pass through a pydantic discriminated union keyed on
``type``; old ``v`` values are first upcast by the functions registered in
:mod:`lodestream.schemas.upcast`. Nothing is ever rewritten on the log.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

import orjson
from pydantic import Field, TypeAdapter, ValidationError

from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import DecodeError, UpcastError
from lodestream.schemas.events import (
    APP_EVENTS,
    BATCH_EVENTS,
    JOB_EVENTS,
    SCALER_EVENTS,
    SESSION_EVENTS,
    SITE_EVENTS,
    XFER_EVENTS,
)
from lodestream.schemas.upcast import upcast

ALL_EVENTS: Final[tuple[type[Event], ...]] = (
    JOB_EVENTS
    + BATCH_EVENTS
    + SESSION_EVENTS
    + XFER_EVENTS
    + APP_EVENTS
    + SITE_EVENTS
    + SCALER_EVENTS
)
EVENT_CLASSES: Final[dict[str, type[Event]]] = {cls.event_type: cls for cls in ALL_EVENTS}  # type: ignore[attr-defined]
CURRENT_VERSION: Final[dict[str, int]] = {
    name: int(cls.model_fields["v"].default) for name, cls in EVENT_CLASSES.items()
}


def _build_adapter() -> TypeAdapter[Any]:
    union: Any = ALL_EVENTS[0]
    for cls in ALL_EVENTS[1:]:
        union = union | cls
    return TypeAdapter(Annotated[union, Field(discriminator="type")])


_ADAPTER: Final = _build_adapter()


def encode(event: Event) -> bytes:
    return event.model_dump_json().encode()


def to_document(event: Event) -> dict[str, Any]:
    """The JSON-ready dict of an event (what ``encode`` writes)."""
    return event.model_dump(mode="json")


def decode(raw: bytes | str) -> Event:
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"not JSON: {exc}") from exc
    # Postgres text and jsonb cannot hold NUL; an event that carries one could never be
    # folded into the read model, so it is no event. The byte test is the fast path: only
    # JSON that spells the escape at all is walked.
    escaped = b"\\u0000" in raw if isinstance(raw, bytes) else "\\u0000" in raw
    if escaped and _has_nul(document):
        raise DecodeError("invalid event: a string holds NUL (\\u0000), which cannot be stored")
    return decode_document(document)


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def decode_document(document: Any) -> Event:
    if not isinstance(document, dict):
        raise DecodeError("event must be a JSON object")
    event_type = document.get("type")
    if not isinstance(event_type, str) or event_type not in CURRENT_VERSION:
        raise DecodeError(f"unknown event type {event_type!r}")
    version = document.get("v")
    if not isinstance(version, int) or isinstance(version, bool):
        raise DecodeError(f"event version must be an integer, got {version!r}")
    current = CURRENT_VERSION[event_type]
    if version != current:
        try:
            document = upcast(document, current)
        except UpcastError as exc:
            raise DecodeError(str(exc)) from exc
    try:
        event: Event = _ADAPTER.validate_python(document)
    except ValidationError as exc:
        raise DecodeError(_summarise(exc)) from exc
    return event


def _summarise(exc: ValidationError) -> str:
    problems = [f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()[:5]]
    return "invalid event: " + "; ".join(problems)
