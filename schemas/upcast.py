"""Upcasters: pure functions that lift an old event document one version up.

Register with :func:`upcaster`; :func:`upcast` applies them in order until
the document reaches the current version. A document newer than the code,
or with a gap in the chain, is refused rather than guessed at.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lodestream.schemas.errors import UpcastError

Document = dict[str, Any]
Upcaster = Callable[[Document], Document]

_UPCASTERS: dict[tuple[str, int], Upcaster] = {}


def upcaster(event_type: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
    """Register ``fn`` to turn ``event_type`` v``from_version`` into v``from_version + 1``."""

    def register(fn: Upcaster) -> Upcaster:
        key = (event_type, from_version)
        if key in _UPCASTERS:
            raise ValueError(f"upcaster for {event_type} v{from_version} already registered")
        _UPCASTERS[key] = fn
        return fn

    return register


def unregister(event_type: str, from_version: int) -> None:
    _UPCASTERS.pop((event_type, from_version), None)


def upcast(document: Document, current: int) -> Document:
    event_type = str(document["type"])
    version = int(document["v"])
    if version > current:
        raise UpcastError(f"{event_type} v{version} is newer than this code (v{current})")
    while version < current:
        fn = _UPCASTERS.get((event_type, version))
        if fn is None:
            raise UpcastError(f"no upcaster for {event_type} v{version}")
        document = fn(dict(document))
        version += 1
        document["v"] = version
    return document
