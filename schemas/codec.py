"""Wire codec: event ⇄ bytes, with upcasting of old versions on the way in.

Each event class has its own pre-built validator. A consumer knows the type
from the subject (:func:`decode_as`): the common case is one pass of that
class's validator over the bytes. Anything else goes the general way
(:func:`decode`): parse, pick the class by ``type``, upcast an old ``v`` with
the functions registered in :mod:`lodestream.schemas.upcast`, validate. Both
accept and refuse the same payloads (``tests/unit/test_codec_decode_as.py``).
Nothing is ever rewritten on the log.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import orjson
from pydantic import ValidationError

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

_VALIDATE_JSON: Final[dict[str, Callable[[bytes], Any]]] = {
    name: cls.__pydantic_validator__.validate_json for name, cls in EVENT_CLASSES.items()
}
_VALIDATE_PYTHON: Final[dict[str, Callable[[Any], Any]]] = {
    name: cls.__pydantic_validator__.validate_python for name, cls in EVENT_CLASSES.items()
}
_NUL_ESCAPE: Final = b"\\u0000"
# Every class has defaults for these (Event.create relies on them), but a payload must state
# them: decode() refuses a document without its type or version.
_STATED: Final = frozenset({"type", "v"})


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
    escaped = _NUL_ESCAPE in raw if isinstance(raw, bytes) else "\\u0000" in raw
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


def decode_as(event_type: str, raw: bytes) -> Event:
    """Decode ``raw`` that its subject says is an ``event_type``; raise :class:`DecodeError`.

    Accepts and refuses exactly what :func:`decode` does, and returns the same event. The
    common case (the current version of the subject's type, no NUL escape) is one pass of
    that class's validator over the bytes, with no dict in between; anything else (a
    refusal, an old version to upcast, a payload of another type) goes through
    :func:`decode`, whose verdict and reason are the rule. Where pydantic's own JSON parser
    is laxer than orjson (``NaN``, ``Infinity``, ``1e400``, a ``v`` of ``1.0``) the models
    refuse the value themselves, so that the fast pass never accepts more.
    """
    validate = _VALIDATE_JSON.get(event_type)
    if validate is not None and _NUL_ESCAPE not in raw:
        try:
            event: Event = validate(raw)
        except ValidationError:
            pass  # decode() says why, or upcasts an old version
        else:
            if event.model_fields_set >= _STATED:
                return event
    return decode(raw)


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
        event: Event = _VALIDATE_PYTHON[event_type](document)
    except ValidationError as exc:
        raise DecodeError(_summarise(event_type, exc)) from exc
    return event


def _summarise(event_type: str, exc: ValidationError) -> str:
    # Located under the type, as a discriminated union over every class reported them.
    problems = [
        f"{'.'.join([event_type, *(str(p) for p in err['loc'])])}: {err['msg']}"
        for err in exc.errors()[:5]
    ]
    return "invalid event: " + "; ".join(problems)
