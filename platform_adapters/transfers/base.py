"""The transfer backend interface: submit a batch of items as one task, poll the task.

A backend (``globus``, ``local``, ``rsync``) moves files between one *remote location* (a
name in the site's ``transfers.locations`` with its URL) and the site's filesystem. The site's
transfer module groups pending items by (location, direction) and hands each group to
``submit`` as one ``TransferBatch``; it then calls ``poll`` with the returned task id until the
task is final, and appends one result event per item.

Contract shared by every backend (checked by ``tests/support/transfer_contract.py``):

* ``submit(batch)`` starts the task and returns its id (a non-empty string) at once; it does
  not wait for the copy. The same ``batch.submission_key`` submitted twice — a module that died
  after submitting and before recording the id — must not copy twice: a backend either returns
  the first task's id (Globus submission ids, a local task directory named after the key) or
  starts a task whose work is already done.
* ``poll(task_id)`` returns a ``TaskStatus``. While the task runs, items already settled may
  be reported; once ``final`` is true every item of the batch has an ``ItemOutcome``. A task id
  the backend never issued raises ``UnknownTask``.
* An item that cannot succeed whatever the retries (the source does not exist, permission
  denied, no space) has ``outcome.permanent = True`` and the backend's own words in ``reason``;
  a transient failure (connection lost, a fault mid-copy) has ``permanent = False`` and the
  module submits the item again, within its retry budget.
* ``check_item(batch, item)`` raises ``TransferRefused`` for an item this backend can never
  move (a relative or malformed path, one that climbs out of the location's base), without
  any I/O. The module asks it of every item before it submits, fails the refused items alone,
  each with its own reason, and submits the rest: one bad path never fails its neighbours.
* ``submit`` raises ``TransferUnavailable`` when the backend cannot be reached or its tool is
  missing (transient: the batch is tried again later), ``TransferRefused`` when the service
  refuses the whole batch for good (a missing endpoint, an item ``check_item`` refuses), and
  ``ConsentRequired`` when the user must act (Globus consent or endpoint activation); the
  message says what to do.
* ``cancel(task_id)`` is best effort and idempotent.
* **Overwrite** (``item.overwrite``), the same outcome on every backend: ``always`` replaces
  an existing destination file; ``if-newer`` replaces it only when the source is newer (a
  destination as new or newer is kept and the item succeeds); ``never`` keeps it: the item
  succeeds when the destination already holds the source's bytes (a retry, the same input
  staged again) and fails for good, naming the policy, when it differs. A file item whose
  destination is a directory fails for good under every policy ("Is a directory"): no backend
  nests the file inside it.
* **Integrity**: ``item.verify`` checks what was written against the source (a mismatch is
  transient: the item is moved again); ``item.sha256`` is the file's expected digest: a
  mismatch fails the item for good, its reason naming both digests, and leaves no file under
  the destination's name on the site.
* ``spreads``: True for a backend that moves a task's items one after another at no fixed
  cost per task (local, rsync): the module spreads a batch over its free task slots instead
  of queueing the items behind each other in one task. A backend with a fixed cost per task
  (Globus: a submission, a task to poll) keeps batching.
* ``poll_every_s``: how soon a task's end is worth asking after. None (Globus: every poll is
  a request to a rate-limited service) leaves it to the site's ``poll_interval_s``; a backend
  whose tasks run in this process (local, rsync), where a poll reads a file, names a short
  interval, and the module also submits its batches as soon as its feed is drained instead
  of at the next poll cycle: a small copy then ends in a fraction of a second.

Paths: ``TransferItem.source`` and ``destination`` are absolute paths, each on its own side:
for ``direction == "in"`` the source is on the remote location and the destination on the
site; for ``"out"`` the other way round. The module has already checked that the site-side path
lies inside the job's workdir.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar, Final, Literal

from lodestream.platform_adapters.errors import PlatformError
from lodestream.schemas.resources import Overwrite

Direction = Literal["in", "out"]
# Task ids and submission keys travel as words on command lines and in file names.
TASK_ID: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")


class TransferError(PlatformError):
    """Base of transfer backend errors."""


class TransferUnavailable(TransferError):
    """The backend cannot be reached now, or its tool is missing; try the batch again later."""


class TransferRefused(TransferError, ValueError):
    """The service refused the whole batch for good; ``str()`` carries its own words."""


class ConsentRequired(TransferRefused):
    """A person must act first (Globus consent, endpoint activation); the message says how."""


class UnknownTask(TransferError, LookupError):
    """``poll`` of a task id this backend never issued (or has forgotten)."""


@dataclass(frozen=True, slots=True)
class TransferItem:
    """One file or directory of a batch; ``item_id`` is the transfer item's aggregate id."""

    item_id: str
    source: str
    destination: str
    recursive: bool = False
    # The module always says; "always" is what a backend did before policies existed.
    overwrite: Overwrite = "always"
    verify: bool = False
    sha256: str | None = None  # the file's expected digest (lowercase hex)


@dataclass(frozen=True, slots=True)
class TransferBatch:
    location: str  # the remote location's name in the site's settings
    url: str  # that location's URL (globus://<endpoint>/, rsync://user@host, local:)
    direction: Direction
    items: tuple[TransferItem, ...]
    # Derived from the items and their attempt: the same batch submitted again yields the same
    # key, so a backend can tell a retried submission from a new one.
    submission_key: str

    def __post_init__(self) -> None:
        if not self.items:
            raise ValueError("a transfer batch needs at least one item")
        if not TASK_ID.fullmatch(self.submission_key):
            raise ValueError(f"submission key {self.submission_key!r} is not a plain word")


@dataclass(frozen=True, slots=True)
class ItemOutcome:
    ok: bool
    bytes_transferred: int | None = None
    reason: str = ""  # the backend's own words when not ok
    permanent: bool = False  # retrying cannot help (not found, permission denied)


@dataclass(frozen=True, slots=True)
class TaskStatus:
    task_id: str
    final: bool
    # Settled items by item_id; complete once ``final``.
    items: dict[str, ItemOutcome] = field(default_factory=dict)
    detail: str = ""  # what the service says about the task as a whole, for logs


class TransferBackend(ABC):
    """One way of moving files; the site holds one instance per configured location."""

    name: ClassVar[str]
    spreads: ClassVar[bool] = False  # see the module doc
    poll_every_s: ClassVar[float | None] = None  # see the module doc

    @abstractmethod
    def check_item(self, batch: TransferBatch, item: TransferItem) -> None:
        """Raise ``TransferRefused`` if ``item`` of ``batch`` can never be moved here."""

    @abstractmethod
    def submit(self, batch: TransferBatch) -> str:
        """Start moving the batch's items; return the task id at once."""

    @abstractmethod
    def poll(self, task_id: str) -> TaskStatus:
        """The task's progress; every item has an outcome once ``final``."""

    def cancel(self, task_id: str) -> None:  # noqa: B027 - optional, best effort
        """Ask the backend to stop the task; a no-op where it cannot."""
