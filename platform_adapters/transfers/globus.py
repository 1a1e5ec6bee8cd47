"""The Globus backend: each batch is one Globus transfer task, through globus-sdk's TransferClient.

A location's URL is ``globus://<collection or endpoint uuid>/[base path]``. Paths of the remote
side are taken below the base path (``globus://…/project/`` with ``/run1/in.h5`` reads
``/project/run1/in.h5``); paths of the site side are taken below ``site_root``, the directory of
this machine that the site's own collection shows as ``/``. A ``..`` in either is refused.

Submissions are idempotent: the task's submission id is a UUID derived from the batch's
``submission_key`` (``submission_id``), and Globus answers a submission id it has seen before
with ``Duplicate`` and the first task's id instead of starting a second copy.

The task is submitted with ``skip_source_errors`` (a missing or unreadable source path is
skipped and reported per path instead of stalling the whole task), ``fail_on_quota_errors``
(a full quota ends the task instead of waiting for space until the deadline) and
``verify_checksum``. A task that keeps failing on an error no retry cures (``PERMANENT_CODES``,
e.g. permission denied on the destination) would otherwise be retried by Globus until its
deadline, a day or more; ``poll`` cancels it and fails its items with that error.

Errors: see ``globus_errors.py``; the login and the tokens: ``globus_login.py``.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path, PurePosixPath
from typing import Any, Final, Literal, TypeGuard, get_args
from urllib.parse import urlsplit

from globus_sdk import MISSING, GlobusAPIError, NetworkError, TransferClient, TransferData

from lodestream.platform_adapters.transfers.base import (
    TASK_ID,
    ConsentRequired,
    Direction,
    TaskStatus,
    TransferBackend,
    TransferBatch,
    TransferItem,
    TransferRefused,
    TransferUnavailable,
    UnknownTask,
)
from lodestream.platform_adapters.transfers.globus_errors import (
    PERMANENT_CODES,
    login_command,
    mapped_errors,
)
from lodestream.platform_adapters.transfers.globus_login import transfer_client
from lodestream.platform_adapters.transfers.globus_tasks import (
    RECORDS_DIR,
    RecordedItem,
    TaskRecord,
    TaskRecords,
    settle,
)
from lodestream.schemas.xfer import remote_path_problem

log = logging.getLogger(__name__)

SyncLevel = Literal["exists", "size", "mtime", "checksum"]
SYNC_LEVELS: Final[tuple[str, ...]] = get_args(SyncLevel)
# Fixed for good: changing it would give a retried batch a new submission id, and a second copy.
SUBMISSION_NAMESPACE: Final = uuid.UUID("47fda298-5e91-442b-8e5b-dea680fdff90")
LABEL_MAX: Final = 128  # Globus refuses longer task labels


def submission_id(submission_key: str) -> str:
    """The Globus submission id of a batch: the same key always gives the same id."""
    return str(uuid.uuid5(SUBMISSION_NAMESPACE, submission_key))


def parse_globus_url(url: str) -> tuple[str, PurePosixPath]:
    """``globus://<uuid>/[base]`` → (the collection id, the base path); ``TransferRefused``."""
    parts = urlsplit(url)
    if parts.scheme != "globus" or parts.query or parts.fragment or "@" in parts.netloc:
        raise TransferRefused(f"{url!r} is not a globus://<collection uuid>/[path] URL")
    try:
        collection = str(uuid.UUID(parts.netloc))
    except ValueError:
        raise TransferRefused(f"{url!r}: {parts.netloc!r} is not a Globus collection id") from None
    return collection, _absolute(parts.path or "/", f"the base path of {url!r}")


def _absolute(path: str, what: str) -> PurePosixPath:
    if not path.startswith("/") or "\0" in path or ".." in path.split("/"):
        raise TransferRefused(f"{what} must be an absolute path without '..', got {path!r}")
    return PurePosixPath(path)


def _remote(path: str) -> PurePosixPath:
    """A remote path: the rule every backend applies (the api's too), and no '..' at all."""
    problem = remote_path_problem(path)
    if problem is not None:
        raise TransferRefused(problem)
    return _absolute(path, "a remote path")


def _collection_id(value: str, what: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise ValueError(f"{what} {value!r} is not a Globus collection id (a UUID)") from None


class GlobusBackend(TransferBackend):
    """Moves batches between a Globus collection and the site's own collection."""

    name = "globus"

    def __init__(
        self,
        client: TransferClient,
        *,
        site_collection: str,
        site_dir: Path,
        sync_level: SyncLevel = "mtime",
        site_root: str = "/",
    ) -> None:
        """``site_collection``: the site's own collection id; ``site_dir`` holds the task
        records and names the login command in errors; ``sync_level``: what Globus compares
        before copying a file that already exists (``mtime``: copy when the source is newer);
        ``site_root``: the directory of this machine that the site's collection shows as ``/``.
        """
        if sync_level not in SYNC_LEVELS:
            raise ValueError(f"sync_level must be one of {', '.join(SYNC_LEVELS)}: {sync_level!r}")
        self.client = client
        self.site_collection = _collection_id(site_collection, "site_collection")
        self.site_dir = site_dir
        self.sync_level: SyncLevel = sync_level
        self.site_root = _absolute(site_root, "site_root")
        self.records = TaskRecords(site_dir / RECORDS_DIR)

    @classmethod
    def from_site_tokens(
        cls, site_dir: Path, *, client_id: str, site_collection: str, **options: Any
    ) -> GlobusBackend:
        """The backend with the tokens ``lode site globus-login`` stored in ``site_dir``."""
        return cls(
            transfer_client(site_dir, client_id=client_id),
            site_collection=site_collection,
            site_dir=site_dir,
            **options,
        )

    def _site_path(self, path: str) -> str:
        absolute = _absolute(path, "a site path")
        if not absolute.is_relative_to(self.site_root):
            raise TransferRefused(
                f"{path} is outside {self.site_root}, the directory the site's collection shows"
            )
        return str(PurePosixPath("/") / absolute.relative_to(self.site_root))

    def _recorded(
        self, item: TransferItem, direction: Direction, base: PurePosixPath
    ) -> RecordedItem:
        """The item with the paths Globus is given, each on its own collection."""
        if direction == "in":
            source = str(base / _remote(item.source).relative_to("/"))
            destination = self._site_path(item.destination)
        else:
            source = self._site_path(item.source)
            destination = str(base / _remote(item.destination).relative_to("/"))
        if item.recursive:  # Globus's own examples name directories with a trailing slash
            source, destination = source.rstrip("/") + "/", destination.rstrip("/") + "/"
        return RecordedItem(item.item_id, source, destination, item.recursive)

    def check_item(self, batch: TransferBatch, item: TransferItem) -> None:
        _, base = parse_globus_url(batch.url)
        self._recorded(item, batch.direction, base)

    def submit(self, batch: TransferBatch) -> str:
        """Submit the batch as one Globus task; a resubmitted batch gets its first task's id."""
        collection, base = parse_globus_url(batch.url)
        items = tuple(self._recorded(item, batch.direction, base) for item in batch.items)
        ends = (collection, self.site_collection)
        source, destination = ends if batch.direction == "in" else ends[::-1]
        sub_id = submission_id(batch.submission_key)
        data = TransferData(
            source,
            destination,
            label=f"lodestream {batch.location} {batch.direction}"[:LABEL_MAX].strip(),
            submission_id=sub_id,
            sync_level=self._sync_level(batch) or MISSING,
            verify_checksum=True,
            skip_source_errors=True,
            fail_on_quota_errors=True,
            notify_on_succeeded=False,  # one mail per staged batch would bury the useful ones
        )
        for item, asked in zip(items, batch.items, strict=True):
            # Globus checks the file it wrote against the expected digest and fails it if not.
            data.add_item(
                item.source, item.destination, recursive=item.recursive,
                external_checksum=asked.sha256 or MISSING,
                checksum_algorithm="SHA256" if asked.sha256 else MISSING,
            )  # fmt: skip
        with mapped_errors(self.site_dir, f"submit a transfer for location {batch.location}"):
            result = self.client.submit_transfer(data)
        code, task_id = result.get("code"), result.get("task_id")
        if code not in ("Accepted", "Duplicate") or not _is_task_uuid(task_id):
            raise TransferUnavailable(
                f"Globus answered the submission for {batch.location} with {code!r} and no task: "
                f"{result.get('message')}"
            )
        self.records.add(TaskRecord(task_id, sub_id, batch.location, items))
        log.info("globus task %s for %s: %s (submission %s)", task_id, batch.location, code, sub_id)
        return task_id

    def _sync_level(self, batch: TransferBatch) -> SyncLevel | None:
        """The task's sync level from its items' overwrite policy (the module never mixes
        policies in one batch): ``if-newer`` is Globus's ``mtime``; ``never`` its
        ``checksum``: a file already holding the source's bytes is not copied again, but
        Globus has no way to keep one that differs, so it is replaced (docs/transfers.md);
        ``always``: no sync level, every file is copied. ``sync_level`` (the site's
        ``globus_sync_level``) stands for ``always`` only where it is not the default."""
        policies = {item.overwrite for item in batch.items}
        if len(policies) != 1:
            raise TransferRefused("globus: one task takes one overwrite policy for its items")
        policy = policies.pop()
        if policy == "if-newer":
            return "mtime"
        if policy == "never":
            return "checksum"
        return None if self.sync_level == "mtime" else self.sync_level

    def _record(self, task_id: str) -> TaskRecord:
        record = self.records.load(task_id) if _is_task_uuid(task_id) else None
        if record is None:
            raise UnknownTask(f"this site never submitted Globus task {task_id!r}")
        return record

    def poll(self, task_id: str) -> TaskStatus:
        """The task's state; once it is SUCCEEDED or FAILED, every item's outcome."""
        record = self._record(task_id)
        with mapped_errors(self.site_dir, f"read task {task_id}", task_id=task_id):
            task = self.client.get_task(task_id)
        status = task["status"]
        if status == "ACTIVE":
            return self._active(record, task.data)
        if status == "INACTIVE":
            raise ConsentRequired(
                f"Globus task {task_id} for {record.location} is INACTIVE "
                f"({_nice(task.data) or 'no reason given'}): its credentials have expired or an "
                f"endpoint needs activation; run `{login_command(self.site_dir)}` (and activate "
                "the endpoint if Globus asks) and Globus resumes the task before its deadline"
            )
        if status not in ("SUCCEEDED", "FAILED"):
            raise TransferUnavailable(f"Globus reports task {task_id} as {status!r}, unknown here")
        skipped: list[dict[str, Any]] = []
        transferred: list[dict[str, Any]] = []
        if not task.get("history_deleted"):  # per-path history is kept for 30 days
            with mapped_errors(self.site_dir, f"read task {task_id}'s paths", task_id=task_id):
                skipped = list(self.client.paginated.task_skipped_errors(task_id).items())
                if status == "FAILED":
                    pages = self.client.paginated.task_successful_transfers(task_id)
                    transferred = list(pages.items())
        items = settle(record, task.data, skipped=skipped, transferred=transferred)
        return TaskStatus(task_id, final=True, items=items, detail=f"{status}: {_nice(task.data)}")

    def _active(self, record: TaskRecord, task: dict[str, Any]) -> TaskStatus:
        nice = task.get("nice_status")
        if nice in PERMANENT_CODES:
            reason = f"{nice}: {_nice(task)}"
            self.records.mark_stuck(record, reason)
            log.warning("globus task %s keeps failing (%s); cancelling it", record.task_id, reason)
            self.cancel(record.task_id)
            return TaskStatus(record.task_id, final=False, detail=f"cancelling after {reason}")
        paused = " (paused by a collection administrator)" if task.get("is_paused") else ""
        progress = _nice(task) or "in progress"
        return TaskStatus(record.task_id, final=False, detail=f"ACTIVE: {progress}{paused}")

    def cancel(self, task_id: str) -> None:
        """Ask Globus to cancel the task; a task already finished or unknown is left as it is."""
        if not _is_task_uuid(task_id):
            return
        try:
            self.client.cancel_task(task_id)
        except (GlobusAPIError, NetworkError) as exc:
            log.warning("globus task %s: cancel not done: %s", task_id, exc)


def _is_task_uuid(task_id: object) -> TypeGuard[str]:
    # Task ids name record files: only Globus's own form (a UUID) is let through.
    if not isinstance(task_id, str) or not TASK_ID.fullmatch(task_id):
        return False
    try:
        return str(uuid.UUID(task_id)) == task_id.lower()
    except ValueError:
        return False


def _nice(task: dict[str, Any]) -> str:
    """Globus's own summary of the task's health: short description, then the details."""
    parts = [
        task.get("nice_status_short_description") or task.get("nice_status"),
        task.get("nice_status_details"),
    ]
    return "; ".join(str(p).strip() for p in parts if p)
