"""Throughput over time: how many jobs entered each state, per bin.

Every entry counts, so a job that ran twice adds two to RUNNING; skipped steps count too
(the job passed through the state, in no time). States no job entered are left out.
"""

from __future__ import annotations

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
    counts: dict[JobState, list[int]] = {}
    for job in jobs:
        for entry in job.entries:
            if window.start <= entry.at <= window.end:
                row = counts.get(entry.state)
                if row is None:
                    row = counts[entry.state] = [0] * bins.count
                row[bins.index(entry.at)] += 1
    ordered = {state: tuple(counts[state]) for state in JobState if state in counts}
    return Throughput(bins, ordered)
