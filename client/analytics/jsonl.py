"""A copy of the log in a file, one JSON object per line: what ``lode analytics export``
writes and ``--from-file`` reads (``lode analytics simulate --from-file`` reads it too).

Each line is one message of the ``EVENTS`` stream: the event as stored, with its stream
sequence and subject beside its fields::

    {"seq": 42, "subject": "evt.alpha.job.<id>.started", "id": "…", "type": "job.started", …}
    {"seq": 43, "subject": "evt.alpha.job.<id>.started", "raw": "not json"}

``raw`` keeps, as text, a body that is not a JSON object (or that has a ``seq``, ``subject``
or ``raw`` field of its own, which the line's could not sit beside), so that a copy
reproduces what the log holds, refusals included: the copy is made without judging
anything, and the shared rule judges each line when it is read, exactly as it judges a
live message. A line without ``subject`` is read as stored on the subject its event names;
one without ``seq`` takes its line number.

The lines ``lode events --json`` prints (the API's job events) are read too. They hold no
subject and no schema version: the subject is rebuilt from the event's site, type and job,
and the version is the current one, which is what those rows hold (the projector stores the
payload it decoded, upcast to the current version). They carry no session or batch events,
so the pilot figures stay empty from such a file.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import orjson

from lodestream.client.analytics.errors import SourceError
from lodestream.client.analytics.intake import IntakeReport, Raw
from lodestream.schemas.codec import CURRENT_VERSION

LINES_PER_BATCH: Final = 10_000
_API_KEYS: Final = frozenset({"job_id", "event_id", "site", "type", "occurred_at"})
_LINE_KEYS: Final = frozenset({"seq", "subject", "raw"})


def export_line(raw: Raw) -> bytes:
    """The line of ``raw`` (newline included)."""
    head = {"seq": raw.seq, "subject": raw.subject}
    try:
        body = orjson.loads(raw.data)
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict) or body.keys() & _LINE_KEYS:
        return orjson.dumps({**head, "raw": raw.data.decode(errors="replace")}) + b"\n"
    return orjson.dumps({**head, **body}) + b"\n"


def file_batches(path: Path, report: IntakeReport) -> Iterator[list[Raw]]:
    """The messages of the copy at ``path``, in batches; lines that hold none are counted in
    ``report``. :class:`SourceError` if the file cannot be read or holds no message at all."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {exc.strerror or exc}") from exc
    seen = 0
    with handle:
        batch: list[Raw] = []
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            raw = _message(line, number, report)
            if raw is None:
                if seen == 0 and number >= 10:
                    raise SourceError(
                        f"{path} is not a copy of the log: none of its first lines is an "
                        "event line (lode analytics export writes one)"
                    )
                continue
            seen += 1
            batch.append(raw)
            if len(batch) >= LINES_PER_BATCH:
                yield batch
                batch = []
        if batch:
            yield batch
    if seen == 0 and report.unreadable:
        raise SourceError(f"{path} holds no event line ({report.unreadable} unreadable lines)")


def _object(line: bytes, number: int, report: IntakeReport) -> dict[str, Any] | None:
    try:
        document = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        report.refuse(0, "", "unreadable", f"line {number}: not JSON ({exc})")
        return None
    if not isinstance(document, dict):
        report.refuse(0, "", "unreadable", f"line {number}: not a JSON object")
        return None
    return document


def _message(line: bytes, number: int, report: IntakeReport) -> Raw | None:
    document = _object(line, number, report)
    if document is None:
        return None
    seq = document.pop("seq", number)
    subject = document.pop("subject", None)
    if not isinstance(seq, int) or isinstance(seq, bool):
        report.refuse(0, "", "unreadable", f"line {number}: its seq is not a number")
        return None
    if isinstance(subject, str) and isinstance(document.get("raw"), str) and len(document) == 1:
        return Raw(seq, subject, document["raw"].encode())
    if document.keys() >= _API_KEYS:
        return _from_api_row(seq, document)
    if "type" in document:
        if not isinstance(subject, str):
            kind, _, name = str(document["type"]).partition(".")
            subject = f"evt.{document.get('site')}.{kind}.{document.get('aggregate_id')}.{name}"
        return Raw(seq, subject, orjson.dumps(document))
    report.refuse(seq, "", "unreadable", f"line {number}: neither an event nor an event row")
    return None


def _from_api_row(seq: int, row: dict[str, Any]) -> Raw:
    kind, _, name = str(row["type"]).partition(".")
    event = {
        "id": row["event_id"],
        "type": row["type"],
        "v": CURRENT_VERSION.get(str(row["type"]), 1),
        "site": row["site"],
        "aggregate_id": row["job_id"],
        "occurred_at": row["occurred_at"],
        "actor": row.get("actor"),
        "data": row.get("data"),
    }
    subject = f"evt.{row['site']}.{kind}.{row['job_id']}.{name}"
    return Raw(seq, subject, orjson.dumps(event))
