"""Folding a batch in slices, so that the one before it is written meanwhile (consumer.py).

The projector's Python (the shared rule's decode, the fold, the rows) and Postgres's
write of a batch took turns: each waited for the other, and the two cores were never
both busy. The live projector now decodes and folds batch N+1 while the transaction of
batch N is in Postgres. Folding is CPU on the event loop, so it is cut into slices that
give the loop back between them: N's statements go out as soon as each answer comes in.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

from lodestream.services.projector.messages import (
    Decoded,
    RawMessage,
    decode_message,
)
from lodestream.services.projector.projection import Changes, Known, Projection, ids_to_load
from lodestream.services.projector.rows import QuarantineRow
from lodestream.services.projector.store import Rows

# Messages decoded or folded between two yields to the event loop: about a millisecond of
# CPU, small beside a batch's write, large beside a yield's cost.
SLICE = 64


@dataclass(slots=True)
class Fold:
    """A batch folded onto ``known`` as it stands at sequence ``after``, and its rows."""

    known: Known
    after: int
    last: int
    count: int
    changes: Changes
    rows: Rows


@dataclass(slots=True)
class InFlight:
    """A batch being committed while the next is read: what the next may build on."""

    task: asyncio.Task[bool]
    mark: object
    folded: asyncio.Future[Fold | None]
    named: set[uuid.UUID]


async def decode_sliced(raws: list[RawMessage]) -> list[Decoded | QuarantineRow]:
    decoded: list[Decoded | QuarantineRow] = []
    for start in range(0, len(raws), SLICE):
        decoded.extend(decode_message(raw) for raw in raws[start : start + SLICE])
        await asyncio.sleep(0)
    return decoded


async def fold_sliced(
    known: Known, after: int, pending: list[tuple[RawMessage, Decoded | QuarantineRow]]
) -> Fold:
    """Fold ``pending`` (all after ``after``) onto ``known``; take its rows at once.

    The rows are taken before anything else may fold onto the same job objects.
    """
    changes = Changes()
    await fold_into(Projection(known, changes), pending)
    rows = Rows.taken(changes)
    last = pending[-1][0].seq
    return Fold(known, after, last, len(pending), changes, rows)


async def fold_into(
    projection: Projection, pending: list[tuple[RawMessage, Decoded | QuarantineRow]]
) -> None:
    """Fold ``pending`` with ``projection``, giving the event loop back between slices."""
    for start in range(0, len(pending), SLICE):
        for raw, item in pending[start : start + SLICE]:
            projection.fold(raw, item)
        if start + SLICE < len(pending):
            await asyncio.sleep(0)


def named_ids(decoded: list[Decoded | QuarantineRow]) -> set[uuid.UUID]:
    """The aggregates (jobs, batch jobs, transfers) a batch's events name."""
    jobs, batches, xfers = ids_to_load(decoded)
    return jobs | batches | xfers
