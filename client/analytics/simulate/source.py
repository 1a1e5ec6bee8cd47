"""Events for the simulator, from a JSON-lines file or the API's feed, through the trust rule.

A line is either an event as the log stores it (the envelope's JSON; a ``subject`` beside it
is the subject it was read from, and ``seq`` is ignored), or a row of the API's event feed
(``lode events --json``: ``event_id``, ``job_id``, …, ``data``). Each is checked with the
shared rule (:func:`lodestream.schemas.trust.event_from_message`) before it is used; one
that fails is skipped, logged and counted, and never stops the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from lodestream.schemas.codec import CURRENT_VERSION
from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import Untrusted
from lodestream.schemas.trust import event_from_message

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Refusals:
    """How many lines were skipped; the first reason, for the report."""

    count: int = 0
    first: str = ""

    def add(self, why: str) -> None:
        self.count += 1
        self.first = self.first or why
        log.warning("simulate: skipped an event: %s", why)


def from_lines(lines: Iterable[str | bytes], refusals: Refusals) -> Iterator[Event]:
    """The checked events of JSON ``lines`` (blank lines are ignored)."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            document = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            refusals.add(f"line {number}: not JSON: {exc}")
            continue
        event = _checked(document, refusals, f"line {number}")
        if event is not None:
            yield event


def from_feed(rows: Iterable[dict[str, Any]], refusals: Refusals) -> Iterator[Event]:
    """The checked events of the API feed's rows."""
    for row in rows:
        event = _checked(row, refusals, f"seq {row.get('seq')}")
        if event is not None:
            yield event


def _checked(document: Any, refusals: Refusals, where: str) -> Event | None:
    if not isinstance(document, dict):
        refusals.add(f"{where}: not a JSON object")
        return None
    envelope = _envelope(document)
    subject = document.get("subject") or _subject_of(envelope)
    try:
        return event_from_message(str(subject), orjson.dumps(envelope))
    except Untrusted as exc:
        refusals.add(f"{where}: {exc}")
        return None


def _envelope(document: dict[str, Any]) -> dict[str, Any]:
    if "event_id" in document and "job_id" in document:  # a feed row: the stored payload
        kind = str(document.get("type"))
        return {"id": document["event_id"], "type": kind, "v": CURRENT_VERSION.get(kind, 1),
                "site": document.get("site"), "aggregate_id": document["job_id"],
                "occurred_at": document.get("occurred_at"), "actor": document.get("actor"),
                "data": document.get("data")}  # fmt: skip
    return {k: v for k, v in document.items() if k not in {"subject", "seq"}}


def _subject_of(envelope: dict[str, Any]) -> str:
    # Read from a file, the event has no subject of its own: the one it would have been
    # stored on. The rule still checks its writer, its payload's sites and its schema.
    kind, _, name = str(envelope.get("type")).partition(".")
    return f"evt.{envelope.get('site')}.{kind}.{envelope.get('aggregate_id')}.{name}"
