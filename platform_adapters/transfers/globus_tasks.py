"""What the Globus backend remembers of each task, and the pure reading of a task's end.

Globus's task document says how the task went, not which of lodestream's items it carried, so
``submit`` writes a small record per task (``<site>/globus-tasks/<task id>.json``: the items
with the paths Globus was given) and ``poll`` reads it back, also after a restart. A task with
no record is one this backend never issued: ``UnknownTask``.

``settle`` turns a finished task into one outcome per item:

* a path Globus skipped (``skip_source_errors``: the source is missing, unreadable or
  ambiguous) fails its item for good, with the skipped error's own words;
* on ``SUCCEEDED`` every other item succeeded, whether Globus copied it or found it already in
  sync;
* on ``FAILED`` a single file that Globus lists as transferred succeeded; every other item fails
  with the task's fatal error, for good when its code is in ``PERMANENT_CODES``. A task that
  this backend cancelled because it was stuck on such an error fails with that error.

Globus counts bytes per task, not per file, so an item's ``bytes_transferred`` is known only
when it is the task's sole item.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from lodestream.platform_adapters.transfers.base import ItemOutcome
from lodestream.platform_adapters.transfers.globus_errors import PERMANENT_CODES

RECORDS_DIR = "globus-tasks"


@dataclass(frozen=True, slots=True)
class RecordedItem:
    item_id: str
    source: str  # as given to Globus: a path on the source collection
    destination: str
    recursive: bool

    def covers(self, source: str, destination: str) -> bool:
        """Whether a path pair Globus reports belongs to this item (a file below a directory)."""
        if (source.rstrip("/"), destination.rstrip("/")) == (
            self.source.rstrip("/"),
            self.destination.rstrip("/"),
        ):
            return True
        return (
            self.recursive
            and source.startswith(self.source.rstrip("/") + "/")
            and destination.startswith(self.destination.rstrip("/") + "/")
        )


@dataclass(frozen=True, slots=True)
class TaskRecord:
    task_id: str
    submission_id: str
    location: str
    items: tuple[RecordedItem, ...]
    # Set when poll cancelled the task because it kept failing on a permanent error: Globus
    # then reports the task as CANCELED, and this is the reason the items fail with.
    stuck_reason: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TaskRecord:
        return cls(
            task_id=data["task_id"],
            submission_id=data["submission_id"],
            location=data["location"],
            items=tuple(RecordedItem(**item) for item in data["items"]),
            stuck_reason=data.get("stuck_reason"),
        )


class TaskRecords:
    """One JSON file per task under ``directory``, written whole by rename."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, task_id: str) -> Path:
        return self.directory / f"{task_id}.json"

    def load(self, task_id: str) -> TaskRecord | None:
        try:
            text = self._path(task_id).read_text()
        except FileNotFoundError:
            return None
        return TaskRecord.from_json(json.loads(text))

    def add(self, record: TaskRecord) -> None:
        """Keep ``record`` unless the task has one already (a resubmission answered Duplicate)."""
        if self._path(record.task_id).exists():
            return
        self._write(record)

    def mark_stuck(self, record: TaskRecord, reason: str) -> None:
        self._write(replace(record, stuck_reason=reason))

    def _write(self, record: TaskRecord) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._path(record.task_id)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(record)))
        tmp.replace(path)


def skipped_reason(error: Mapping[str, Any]) -> str:
    code = error.get("error_code") or "SKIPPED"
    details = str(error.get("error_details") or error.get("description") or "").strip()
    return f"{code}: {details}" if details else str(code)


def fatal_reason(task: Mapping[str, Any], stuck_reason: str | None) -> tuple[str, bool]:
    """The reason the items of a FAILED task fail with, and whether it is permanent."""
    fatal = task.get("fatal_error") or {}
    code = fatal.get("code") or "FAILED"
    if code == "CANCELED" and stuck_reason:
        return stuck_reason, True
    description = str(fatal.get("description") or task.get("nice_status_short_description") or "")
    return (f"{code}: {description}" if description else str(code)), code in PERMANENT_CODES


def settle(
    record: TaskRecord,
    task: Mapping[str, Any],
    *,
    skipped: Iterable[Mapping[str, Any]],
    transferred: Iterable[Mapping[str, Any]] = (),
) -> dict[str, ItemOutcome]:
    """Every item's outcome once the task is SUCCEEDED or FAILED (see the module docstring)."""
    outcomes: dict[str, ItemOutcome] = {}
    for error in skipped:
        for item in record.items:
            if item.item_id not in outcomes and item.covers(
                str(error.get("source_path", "")), str(error.get("destination_path", ""))
            ):
                outcomes[item.item_id] = ItemOutcome(
                    ok=False, reason=skipped_reason(error), permanent=True
                )
    size = task.get("bytes_transferred")
    done = ItemOutcome(
        ok=True,
        bytes_transferred=size if len(record.items) == 1 and isinstance(size, int) else None,
    )
    if task["status"] == "SUCCEEDED":
        return {item.item_id: outcomes.get(item.item_id, done) for item in record.items}
    copied = [
        (str(t.get("source_path", "")), str(t.get("destination_path", ""))) for t in transferred
    ]
    reason, permanent = fatal_reason(task, record.stuck_reason)
    for item in record.items:
        if item.item_id in outcomes:
            continue
        # A directory may be half copied when the task fails; only a single file is known done.
        if not item.recursive and any(item.covers(s, d) for s, d in copied):
            outcomes[item.item_id] = done
        else:
            outcomes[item.item_id] = ItemOutcome(ok=False, reason=reason, permanent=permanent)
    return outcomes
