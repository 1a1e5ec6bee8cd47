"""What the live projector folded, kept between its batches while nobody else writes.

A batch folds onto the jobs it names and the owners of the sites, and reading them back
costs a query and a decode per job per batch — for rows this process wrote a moment ago.
The live projector therefore keeps its :class:`Known` from one batch to the next, as the
rebuild keeps one for its whole replay, but uses it only while the stream's position row
is the one this process committed (same sequence, same writing transaction): another
projector's batch or a rebuild's swap changes the row, and the cache is dropped and
reloaded from Postgres. A batch takes the cache and gives it back only after its commit,
so a failed batch, which may have folded half of it, leaves nothing behind.

The bound is kept by :meth:`FoldCache.trim`, not on the way back: the next batch may be
folding onto the same ``Known`` while this one commits (consumer.py), and entries taken
from under a fold half done would make its later events look like unknown jobs'.
"""

from __future__ import annotations

import itertools
from collections.abc import MutableMapping
from typing import Any

from lodestream.services.projector.projection import Changes, Known
from lodestream.services.projector.store import Position


class FoldCache:
    def __init__(self, max_jobs: int) -> None:
        self._max_jobs = max_jobs
        self._known: Known | None = None
        self._position: Position | None = None

    def take(self, position: Position) -> Known | None:
        """The cached state if ``position`` is still the one committed with it; else None."""
        known, valid = self._known, self._position == position
        self._known, self._position = None, None
        return known if valid else None

    def clear(self) -> None:
        """Forget what is held: a batch folded ahead onto it will not be written as folded.

        A commit keeps the batch's ``Known`` while the next batch may already be folded
        onto it; that is sound only while that fold may still be written as it is. A failed
        attempt that never reached :meth:`take` (the connection refused, the lock lost)
        would leave it here, and the retry would fold the same events onto it again.
        """
        self._known, self._position = None, None

    def give_back(self, known: Known, position: Position) -> None:
        """``known`` as it stands after a batch committed at ``position``."""
        self._known, self._position = known, position

    def keep(self, known: Known, changes: Changes, position: Position) -> None:
        """After a batch's commit: keep what it folded."""
        for job_id, record in changes.new_jobs.items():
            known.jobs[job_id] = record.progress  # the created event itself is not needed again
        self.give_back(known, position)

    def trim(self, known: Known) -> None:
        """Bound ``known``, before a batch is folded onto it and while nothing else is."""
        # Jobs are mostly touched soon after their creation: past the bound the oldest
        # entries go, and a later event of theirs reloads them from Postgres.
        _trim(known.jobs, self._max_jobs)
        _trim(known.batch_states, self._max_jobs)
        _trim(known.xfer_states, self._max_jobs)


def _trim(entries: MutableMapping[Any, Any], bound: int) -> None:
    if len(entries) > bound:
        for key in list(itertools.islice(entries, len(entries) - bound // 2)):
            del entries[key]
