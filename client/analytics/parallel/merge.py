"""The parts of a split replay, one per process, merged into the :class:`Loaded` that one
replay of the whole range gives.

Each share holds whole aggregates, so the timelines only need putting side by side, in the
order one replay would have made them: a job where its ``job.created`` is, a session where
its ``session.opened`` is, a batch job where its ``batch.requested`` is (each share's are
already in log order; the figures add floats in that order, so it shows in their last
digits). Counts add up; every message was read by exactly one share, so the first and last
sequence read are the extremes of the shares', and the refusals listed are the lowest
sequences of all the shares' lists (each share's list holds its own lowest).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from lodestream.client.analytics.fold import FoldCounts, Timelines
from lodestream.client.analytics.intake import MAX_LISTED, IntakeReport
from lodestream.client.analytics.selection import Selection
from lodestream.client.analytics.summary import Loaded

K = TypeVar("K")
V = TypeVar("V")


def merge_parts(parts: Sequence[Loaded], selection: Selection) -> Loaded:
    """One :class:`Loaded` of ``parts``, the shares of one range under ``selection``."""
    return Loaded(_timelines([p.timelines for p in parts]), _intake([p.intake for p in parts]),
                  selection)  # fmt: skip


def _timelines(parts: Sequence[Timelines]) -> Timelines:
    return Timelines(
        jobs=_in_order([p.jobs for p in parts], lambda job: job.created_seq),
        sessions=_in_order([p.sessions for p in parts], lambda session: session.opened_seq),
        batches=_in_order([p.batches for p in parts], lambda batch: batch.requested_seq),
        first_at=_extreme(min, (p.first_at for p in parts)),
        last_at=_extreme(max, (p.last_at for p in parts)),
        counts=_counts([p.counts for p in parts]),
    )


def _in_order(parts: Sequence[dict[K, V]], seq: Callable[[V], int]) -> dict[K, V]:
    """The entries of ``parts`` (each in order of ``seq``) in one dict, in order of ``seq``."""
    return dict(heapq.merge(*(part.items() for part in parts), key=lambda item: seq(item[1])))


def _counts(parts: Sequence[FoldCounts]) -> FoldCounts:
    return FoldCounts(
        folded=sum(p.folded for p in parts),
        not_selected=sum(p.not_selected for p in parts),
        begun_before=sum(p.begun_before for p in parts),
        other=sum(p.other for p in parts),
        begun_before_jobs=set().union(*(p.begun_before_jobs for p in parts)),
    )


def _intake(parts: Sequence[IntakeReport]) -> IntakeReport:
    listed = heapq.merge(*(p.listed for p in parts), key=lambda refusal: refusal.seq)
    return IntakeReport(
        read=sum(p.read for p in parts),
        accepted=sum(p.accepted for p in parts),
        refused=sum(p.refused for p in parts),
        illegal=sum(p.illegal for p in parts),
        unreadable=sum(p.unreadable for p in parts),
        listed=list(itertools.islice(listed, MAX_LISTED)),
        first_seq=_extreme(min, (p.first_seq for p in parts)),
        last_seq=_extreme(max, (p.last_seq for p in parts)),
    )


N = TypeVar("N", int, float)


def _extreme(pick: Callable[[list[N]], N], values: Iterable[N | None]) -> N | None:
    present = [v for v in values if v is not None]
    return pick(present) if present else None
