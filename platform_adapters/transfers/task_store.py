"""Tasks of the local and rsync backends, kept in files so they outlive the site agent.

A task is a directory ``<root>/<task id>/`` (the task id is the batch's submission key):

* ``task.json`` the batch and each settled item's outcome, rewritten whole (temporary file,
  fsync, rename) after every item, so a reader never sees half a record;
* ``lock`` held (``flock``) by whoever runs the task: a backend object that finds it held
  leaves the task to its holder; the kernel drops it when that process dies, so a task cut
  short by a crash can be taken up again;
* ``cancel`` present once ``cancel()`` was asked, so a resumed task honours it too.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from lodestream.platform_adapters.transfers.base import (
    TASK_ID,
    ItemOutcome,
    TaskStatus,
    TransferBatch,
    TransferError,
    TransferItem,
    TransferRefused,
    UnknownTask,
)

RECORD_FORMAT: Final = 1


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """What ``task.json`` holds: the batch as submitted and the outcomes settled so far."""

    backend: str
    batch: TransferBatch
    outcomes: Mapping[str, ItemOutcome] = field(default_factory=dict)
    final: bool = False
    detail: str = ""

    @property
    def task_id(self) -> str:
        return self.batch.submission_key

    def pending(self) -> tuple[TransferItem, ...]:
        return tuple(item for item in self.batch.items if item.item_id not in self.outcomes)

    def settled(self, item_id: str, outcome: ItemOutcome) -> TaskRecord:
        return replace(self, outcomes=MappingProxyType({**self.outcomes, item_id: outcome}))

    def finished(self, detail: str) -> TaskRecord:
        return replace(self, final=True, detail=detail)

    def status(self) -> TaskStatus:
        if self.final:
            detail = self.detail
        else:
            detail = f"{len(self.outcomes)} of {len(self.batch.items)} items settled"
        return TaskStatus(self.task_id, self.final, dict(self.outcomes), detail)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": RECORD_FORMAT,
            "backend": self.backend,
            "batch": batch_to_json(self.batch),
            "outcomes": {key: _outcome_to_json(value) for key, value in self.outcomes.items()},
            "final": self.final,
            "detail": self.detail,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TaskRecord:
        if data.get("format") != RECORD_FORMAT:
            raise ValueError(f"unknown task record format {data.get('format')!r}")
        return cls(
            backend=str(data["backend"]),
            batch=batch_from_json(data["batch"]),
            outcomes=MappingProxyType({
                str(key): ItemOutcome(**value) for key, value in data["outcomes"].items()
            }),
            final=bool(data["final"]),
            detail=str(data["detail"]),
        )  # fmt: skip


def batch_to_json(batch: TransferBatch) -> dict[str, Any]:
    return {
        "location": batch.location,
        "url": batch.url,
        "direction": batch.direction,
        "submission_key": batch.submission_key,
        "items": [
            {
                "item_id": item.item_id,
                "source": item.source,
                "destination": item.destination,
                "recursive": item.recursive,
                "overwrite": item.overwrite,
                "verify": item.verify,
                "sha256": item.sha256,
            }
            for item in batch.items
        ],
    }


def batch_from_json(data: Mapping[str, Any]) -> TransferBatch:
    return TransferBatch(
        location=str(data["location"]),
        url=str(data["url"]),
        direction=data["direction"],
        submission_key=str(data["submission_key"]),
        items=tuple(TransferItem(**item) for item in data["items"]),
    )


def _outcome_to_json(outcome: ItemOutcome) -> dict[str, Any]:
    return {
        "ok": outcome.ok,
        "bytes_transferred": outcome.bytes_transferred,
        "reason": outcome.reason,
        "permanent": outcome.permanent,
    }


class TaskStore:
    """The task directories of one backend under ``root`` (see the module doc)."""

    def __init__(self, root: Path, backend: str) -> None:
        self.root = root
        self.backend = backend

    def task_dir(self, task_id: str) -> Path:
        # Ids are checked before they become a path: "../x" is no task of ours.
        if not TASK_ID.fullmatch(task_id):
            raise UnknownTask(f"{self.backend}: {task_id!r} is not a task id this backend issues")
        return self.root / task_id

    def create(self, batch: TransferBatch) -> TaskRecord:
        """The batch's task, recorded now unless its submission key already has one.

        A key reused for a different batch is refused: the module derives keys from the
        items, so that is a bug upstream, and running either batch would hide it.
        """
        task_dir = self.task_dir(batch.submission_key)
        existing = self._read(task_dir)
        if existing is not None:
            if batch_to_json(existing.batch) != batch_to_json(batch):
                raise TransferRefused(
                    f"{self.backend}: submission key {batch.submission_key} already names "
                    "a different batch"
                )
            return existing
        task_dir.mkdir(parents=True, exist_ok=True)
        record = TaskRecord(self.backend, batch)
        self.save(record)
        return record

    def load(self, task_id: str) -> TaskRecord:
        record = self._read(self.task_dir(task_id))
        if record is None:
            raise UnknownTask(f"{self.backend}: no task {task_id} in {self.root}")
        return record

    def _read(self, task_dir: Path) -> TaskRecord | None:
        path = task_dir / "task.json"
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise TransferError(f"{self.backend}: cannot read {path}: {exc}") from exc
        try:
            return TaskRecord.from_json(json.loads(text))
        except (ValueError, KeyError, TypeError) as exc:
            raise TransferError(f"{self.backend}: {path} is not a task record: {exc}") from exc

    def save(self, record: TaskRecord) -> None:
        task_dir = self.task_dir(record.task_id)
        with tempfile.NamedTemporaryFile(
            "w", dir=task_dir, prefix=".task.", suffix=".tmp", delete=False
        ) as tmp:
            json.dump(record.to_json(), tmp)
            tmp.flush()
            os.fsync(tmp.fileno())
        try:
            Path(tmp.name).replace(task_dir / "task.json")
        except OSError:
            Path(tmp.name).unlink(missing_ok=True)
            raise

    @contextlib.contextmanager
    def hold(self, task_id: str) -> Iterator[bool]:
        """Try to become the task's runner: yields whether the lock was taken (never waits)."""
        with (self.task_dir(task_id) / "lock").open("a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def request_cancel(self, task_id: str) -> None:
        task_dir = self.task_dir(task_id)
        if task_dir.is_dir():
            (task_dir / "cancel").touch()

    def cancel_requested(self, task_id: str) -> bool:
        return (self.task_dir(task_id) / "cancel").exists()
