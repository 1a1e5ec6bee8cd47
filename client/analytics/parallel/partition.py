"""Which process of a split replay folds a message: decided from its subject alone.

The parent reads the range once and hands each process its share (:func:`split_wires`)
before anything of a message is parsed. Every event of one job, pilot session or batch job
must reach the same process, because the fold of an aggregate needs all of its events in
order; aggregates are independent of each other, so that is all the fold needs. The
subject names the aggregate (``evt.<site>.<kind>.<id>.<type>``), so the share is known
before anything is decoded: the uuid's value modulo the number of shares, the same from one
run to the next (Python's ``hash`` of a string is salted per process, so it would not do).
Events of other kinds (sites, apps, transfers, the scaler), which the fold only counts, and
subjects that name no aggregate at all (which the shared rule will refuse) go to share 0, so
that each is folded exactly once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from lodestream.eventlog.rawpull import Wire
from lodestream.shares import id_share

AGGREGATE_KINDS: Final = frozenset({"job", "session", "batch"})
"""The kinds of aggregate the fold keeps a record of, each folded whole in one share."""
_KINDS_WIRE: Final = frozenset(kind.encode() for kind in AGGREGATE_KINDS)


def share_of(subject: str, shares: int) -> int:
    """The share (0 to ``shares`` - 1) that folds the message on ``subject``."""
    return wire_share_of(subject.encode(), shares)


def wire_share_of(subject: bytes, shares: int) -> int:
    """:func:`share_of` a subject as it comes off the wire, not decoded (this runs for every
    message of the range, in the one process that reads it)."""
    parts = subject.split(b".", 4)
    if len(parts) != 5 or parts[2] not in _KINDS_WIRE:
        return 0
    return id_share(parts[3], shares)


def split_wires(wires: Iterable[Wire], shares: int) -> list[list[Wire]]:
    """``wires`` (messages as the wire gave them) by share, each share's in the order read.

    This is :func:`wire_share_of` for every message of the range, in the one process that
    reads it: inlined, and with the share of each aggregate id kept once it is known (an
    aggregate has several events), so that most messages cost a split and a lookup."""
    parts: list[list[Wire]] = [[] for _ in range(shares)]
    known: dict[bytes, int] = {}
    kinds = _KINDS_WIRE
    for wire in wires:
        tokens = wire[0].split(b".", 4)
        share = 0
        if len(tokens) == 5 and tokens[2] in kinds:
            token = tokens[3]
            found = known.get(token)
            if found is None:
                found = known[token] = id_share(token, shares)
            share = found
        parts[share].append(wire)
    return parts
