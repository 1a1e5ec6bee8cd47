"""The transfer module's decisions, as pure functions: what to submit together, what to report.

Items wait in a pool until submitted. :func:`batches` groups the pool by (location,
direction) — one backend task moves items between one remote place and the site — cuts each
group into batches of at most ``batch_size``, oldest first (an item marked ``alone`` goes in a
batch of its own), and hands out no more batches than there are free task slots
(``max_concurrent`` minus those in flight). :func:`outcome` turns
what a backend said about one item into what the module appends: success, another attempt
(a transient fault within the retry budget), or failure (a permanent fault, or the budget
spent) with the backend's own words.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from lodestream.platform_adapters.transfers.base import (
    Direction,
    ItemOutcome,
    TransferBatch,
    TransferItem,
)
from lodestream.schemas.resources import Overwrite


@dataclass(frozen=True, slots=True)
class PendingItem:
    """An item waiting for a backend task: ``attempt`` is the submission it will be."""

    item_id: uuid.UUID
    location: str
    direction: Direction
    source: str
    destination: str
    recursive: bool
    attempt: int
    since_seq: int  # its request's stream sequence: oldest first
    # Submitted in a task of its own: the service refused a whole batch it was in, and only
    # a task per item tells which item the refusal belongs to.
    alone: bool = False
    overwrite: Overwrite = "never"
    verify: bool = False
    sha256: str | None = None

    @property
    def policy(self) -> tuple[Overwrite, bool]:
        """What a task applies to all its items on a backend that cannot mix (Globus)."""
        return self.overwrite, self.verify or self.sha256 is not None


@dataclass(frozen=True, slots=True)
class Batch:
    location: str
    direction: Direction
    items: tuple[PendingItem, ...]

    @property
    def submission_key(self) -> str:
        """The same items at the same attempts give the same key (see ``TransferBatch``)."""
        text = ",".join(sorted(f"{i.item_id}:{i.attempt}" for i in self.items))
        return "lode-" + hashlib.sha256(text.encode()).hexdigest()[:40]

    def to_request(self, url: str) -> TransferBatch:
        """The batch as its backend is handed it; ``url`` is its location's URL."""
        return TransferBatch(
            location=self.location, url=url, direction=self.direction,
            submission_key=self.submission_key,
            items=tuple(TransferItem(str(i.item_id), i.source, i.destination, i.recursive,
                                     i.overwrite, i.verify, i.sha256) for i in self.items),
        )  # fmt: skip


def batches(
    pool: Iterable[PendingItem],
    *,
    batch_size: int,
    free_slots: int,
    spread: Collection[str] = (),
) -> list[Batch]:
    """The batches to submit now: at most ``free_slots`` of at most ``batch_size`` items.

    A location in ``spread`` has a backend that moves a task's items one after another
    (``TransferBackend.spreads``): slots left free are filled by halving its largest batches,
    so its items move side by side rather than queued behind each other in one task.
    """
    if free_slots <= 0:
        return []
    groups: dict[tuple[str, Direction, tuple[Overwrite, bool]], list[PendingItem]] = {}
    for item in sorted(pool, key=lambda i: (i.since_seq, str(i.item_id))):
        groups.setdefault((item.location, item.direction, item.policy), []).append(item)
    # Full batches first (they move most per task), then the group waiting longest.
    cut: list[tuple[int, int, Batch]] = []
    for (location, direction, _), items in groups.items():
        chunks: list[tuple[PendingItem, ...]] = [(item,) for item in items if item.alone]
        together = [item for item in items if not item.alone]
        chunks += [
            tuple(together[at : at + batch_size]) for at in range(0, len(together), batch_size)
        ]
        for chunk in chunks:
            cut.append((-len(chunk), chunk[0].since_seq, Batch(location, direction, chunk)))
    cut.sort(key=lambda entry: (entry[0], entry[1]))
    chosen = [batch for _, _, batch in cut[:free_slots]]
    while len(chosen) < free_slots:
        halvable = [b for b in chosen if b.location in spread and len(b.items) > 1]
        if not halvable:
            break
        widest = max(halvable, key=lambda b: len(b.items))
        half = (len(widest.items) + 1) // 2
        at = chosen.index(widest)
        chosen[at : at + 1] = [
            replace(widest, items=widest.items[:half]),
            replace(widest, items=widest.items[half:]),
        ]
    return chosen


Verdict = Literal["succeeded", "retry", "failed"]


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    reason: str = ""
    permanent: bool = False


def outcome(result: ItemOutcome, *, attempt: int, retry_budget: int) -> Decision:
    """What to do about one item of a finished task, on its ``attempt``-th submission."""
    if result.ok:
        return Decision("succeeded")
    reason = result.reason or "the transfer backend reported a failure without a reason"
    if result.permanent:
        return Decision("failed", reason, permanent=True)
    if attempt > retry_budget:
        return Decision("failed", f"{reason} (after {attempt} attempts)")
    return Decision("retry", reason)


def missing_items(expected: Sequence[uuid.UUID], reported: Iterable[str]) -> list[uuid.UUID]:
    """Items of a final task the backend said nothing about (a backend bug, or a lost record):
    they are tried again like a transient fault, never taken as done."""
    seen = set(reported)
    return [item for item in expected if str(item) not in seen]
