"""A rebuild's bulk replay of ``EVENTS`` split across processes by job.

One process folds 15,000-18,000 events a second (the shared rule's decode, the fold, the
rows, all on one core), and a rebuild folds the whole log. So the rebuilding process reads
the log once, as the wire gives it, and deals each job's events to one of ``shares``
processes (:func:`deal`), chosen from the subject before anything is parsed: every event
of a job reaches the same process, in log order, and jobs are folded independently of
each other. A job's fold needs one thing from outside it: the owner of its site, to judge
its ``job.created``; so every site event goes to every process too, in its place in the
log, where it is folded for that and nothing else. Everything that is not a job's event
(sites, apps, batch jobs, sessions, transfers, the scaler, and subjects that name no job,
which the shared rule will refuse) is folded and written by the rebuilding process itself.

Each process writes its own jobs' history rows and quarantine as it goes, and its job
rows in one COPY at the end, on its own connection, before it reports
(:func:`rebuild_share`); the rebuilding process then builds the indexes, catches up and
swaps as an unsplit rebuild does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing.connection import Connection

from psycopg import AsyncConnection

from lodestream import aio
from lodestream.eventlog.rawpull import Wire
from lodestream.infra.postgres.tables import REBUILD_SCHEMA
from lodestream.services.projector.bulk import BulkFold, raws_of
from lodestream.services.projector.errors import RebuildError
from lodestream.services.projector.store import ProjectionStore
from lodestream.shares import (
    Receive,
    ShareFailure,
    Shares,
    id_share,
    serve,
    unexpected,
)


@dataclass(frozen=True, slots=True)
class ShareTask:
    """What one process folds: share ``share`` of ``shares`` of ``EVENTS`` up to ``last``."""

    dsn: str
    last: int
    share: int
    shares: int


@dataclass(frozen=True, slots=True)
class ShareDone:
    """What one process folded and wrote."""

    events: int
    jobs: int
    quarantined: int


def shares_for(tasks: list[ShareTask]) -> Shares[ShareTask]:
    return Shares(
        rebuild_share, tasks, name="lode-rebuild", what="rebuild process",
        error=RebuildError, failed=lambda failure: RebuildError(failure.message),
    )  # fmt: skip


def deal(wires: Iterable[Wire], shares: int) -> tuple[list[Wire], list[list[Wire]]]:
    """``wires`` as the rebuilding process keeps them, and as each share gets them.

    This runs for every message of the log, in the one process that reads it: a split of
    the subject and, for a job, the share of its id, kept once known (a job has several
    events in a batch).
    """
    own: list[Wire] = []
    parts: list[list[Wire]] = [[] for _ in range(shares)]
    known: dict[bytes, list[Wire]] = {}
    for wire in wires:
        tokens = wire[0].split(b".")
        if len(tokens) == 5:
            kind = tokens[2]
            if kind == b"job":
                token = tokens[3]
                part = known.get(token)
                if part is None:
                    part = known[token] = parts[id_share(token, shares)]
                part.append(wire)
                continue
            if kind == b"site":
                for part in parts:
                    part.append(wire)
        own.append(wire)
    return own, parts


def rebuild_share(task: ShareTask, pipe: Connection) -> None:
    """Fold the chunks of ``task``'s share received on ``pipe``, write them into the
    rebuild's tables, and send a :class:`ShareDone` back: a spawned process's target."""

    def failure(exc: Exception) -> ShareFailure:
        return unexpected(f"rebuild process {task.share} of {task.shares} failed", exc)

    # The project's loop (uvloop), as in every other process; the collector is paused by serve.
    serve(pipe, lambda receive: aio.run(_fold_share(task, receive)), failure)


async def _fold_share(task: ShareTask, receive: Receive) -> ShareDone:
    conn = await AsyncConnection.connect(task.dsn)
    store = ProjectionStore(REBUILD_SCHEMA)
    fold = BulkFold(store, echo_sites=True)
    try:
        await store.prepare(conn)
        # Received in a thread, so that the write of the last batch goes on meanwhile.
        while (chunk := await asyncio.to_thread(receive)) is not None:
            await fold.take(conn, raws_of(chunk, task.last))
        await fold.finish(conn)
    finally:
        await fold.abandon()
        await conn.close()
    return ShareDone(fold.events, fold.jobs, fold.quarantined)
