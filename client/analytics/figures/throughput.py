"""Throughput over time: how many jobs entered each state, per bin.

Every entry counts, so a job that ran twice adds two to RUNNING; skipped steps count too
(the job passed through the state, in no time). States no job entered are left out.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from lodestream.client.analytics.timeline import JobTimeline
from lodestream.client.analytics.window import Bins, Window
from lodestream.schemas.states import JobState


@dataclass(frozen=True, slots=True)
class Throughput:
    """``counts[state][i]``: entries into ``state`` during bin ``i``."""

    bins: Bins
    counts: dict[JobState, tuple[int, ...]]

    def total(self, state: JobState) -> int:
        return sum(self.counts.get(state, ()))

    def peak_per_s(self, state: JobState) -> float:
        """The busiest bin's rate of entries into ``state`` per second."""
        return max(self.counts.get(state, (0,)), default=0) / self.bins.width


def throughput(jobs: Iterable[JobTimeline], window: Window, bins: Bins) -> Throughput:
    # One pass over every entry (two million in a million events), so the bin of each is
    # computed inline, as Bins.index computes it, and counted with a Counter (in C); the
    # clamp to the first and last bin is applied once per distinct (state, bin).
    start, end = window.start, window.end
    first, width = bins.start, bins.width
    tally = Counter(
        (state, int((at - first) // width))
        for state, at, _, _ in itertools.chain.from_iterable(job.entries for job in jobs)
        if start <= at <= end
    )
    last = bins.count - 1
    counts: dict[JobState, list[int]] = {}
    for (state, i), n in tally.items():
        row = counts.get(state)
        if row is None:
            row = counts[state] = [0] * bins.count
        row[min(last, max(0, i))] += n
    ordered = {state: tuple(counts[state]) for state in JobState if state in counts}
    return Throughput(bins, ordered)
