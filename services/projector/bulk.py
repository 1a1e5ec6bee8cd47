"""One process's part of a rebuild's bulk replay: :class:`BulkFold`.

A rebuild folds the log from sequence 1 into empty tables. Each job row is written once,
at the end (:meth:`BulkFold.finish`), from the jobs the fold holds in memory; everything
else (history rows, the low-volume read models, quarantine) is written a batch at a time,
each batch while the next is folded (in slices, as the live projector folds ahead: see
ahead.py), one transaction in flight. A batch's rows are taken before the next fold
starts, which moves the same job objects on.

The replay may be split across processes by job (split.py). A process that folds jobs is
also sent every site event, which it folds only to know the sites' owners when it judges
a ``job.created`` (``echo_sites``): what those events write is the parent's to write.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Iterable
from typing import Any

from psycopg import AsyncConnection

from lodestream.eventlog.rawpull import Wire, delivery_of
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.services.projector.ahead import decode_sliced, fold_into
from lodestream.services.projector.messages import RawMessage
from lodestream.services.projector.projection import Changes, Known, Projection
from lodestream.services.projector.store import ProjectionStore, Rows


class BulkFold:
    """Folds the messages it is given onto its own :class:`Known`; writes as it goes."""

    def __init__(self, store: ProjectionStore, *, echo_sites: bool = False) -> None:
        self._store = store
        self.known = Known()
        self._changes = Changes()
        self._projection = Projection(self.known, self._changes)
        # Site events folded onto the same Known, their rows thrown away (see the module).
        self._echo = Projection(self.known, Changes()) if echo_sites else None
        self._writing: asyncio.Task[None] | None = None
        self.events = 0
        self.quarantined = 0

    @property
    def jobs(self) -> int:
        return len(self._changes.new_jobs)

    async def take(self, conn: AsyncConnection[Any], raws: list[RawMessage]) -> None:
        """Fold ``raws`` (next in the log after what was taken before); write their rows
        while the next batch is folded."""
        if not raws:
            return
        decoded = await decode_sliced(raws)
        pending = list(zip(raws, decoded, strict=True))
        if self._echo is None:
            await fold_into(self._projection, pending)
            self.events += len(pending)
        else:
            for own, run in itertools.groupby(pending, key=lambda p: is_job(p[0].subject)):
                folded = list(run)
                await fold_into(self._projection if own else self._echo, folded)
                self.events += len(folded) if own else 0
        changes = self._changes
        self.quarantined += len(changes.quarantine)
        # Jobs stay in memory for their one write at the end; the rest goes now.
        rows = Rows.taken(
            Changes(job_events=changes.job_events, ops=changes.ops, quarantine=changes.quarantine)
        )
        changes.job_events, changes.ops, changes.quarantine = [], [], []
        await self.written()
        self._writing = asyncio.create_task(self._write(conn, rows))

    async def written(self) -> None:
        """Wait for the last batch's write (its error, if it failed)."""
        writing, self._writing = self._writing, None
        if writing is not None:
            await writing

    async def finish(self, conn: AsyncConnection[Any]) -> None:
        """Wait for the last batch's write, then write every job folded, in one COPY."""
        await self.written()
        async with conn.transaction():
            await self._store.write_jobs(conn, Changes(new_jobs=self._changes.new_jobs))

    async def abandon(self) -> None:
        """Cancel a write still in flight (after a failure elsewhere)."""
        writing, self._writing = self._writing, None
        if writing is not None and not writing.done():
            writing.cancel()
            with contextlib.suppress(BaseException):
                await writing

    async def _write(self, conn: AsyncConnection[Any], rows: Rows) -> None:
        async with conn.transaction():
            await self._store.write(conn, rows)


def is_job(subject: str) -> bool:
    """Whether ``subject`` is a job's (``evt.<site>.job.<id>.<type>``): the split's unit."""
    parts = subject.split(".")
    return len(parts) == 5 and parts[2] == "job"


def raws_of(wires: Iterable[Wire], last: int) -> list[RawMessage]:
    """The ``EVENTS`` messages of ``wires`` (as the reader gave them) up to sequence ``last``."""
    return [
        RawMessage(EVENTS_STREAM, d.seq, d.subject, d.data)
        for d in map(delivery_of, wires)
        if d.seq <= last
    ]
