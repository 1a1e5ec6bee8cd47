"""Jobs in each state over time, per bin: the report's stacked area, and its colours.

A job is in a state from the moment it entered it until it entered the next one (or the
window's end); a step skipped inside a later event lasts no time. Per bin, the time average
of the jobs in each state, so the layers of a bin add up to the jobs in the system then
(final states included: they pile up as the run goes on). :data:`STATE_COLOURS` gives every
state its own colour, the same in every report.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from lodestream.client.analytics.timeline import JobTimeline
from lodestream.client.analytics.window import Bins, Window, time_average
from lodestream.schemas.states import JobState

S = JobState
# matplotlib's tab20, one colour a state: waiting states in greys and olives, the run in
# blues, its failures in reds and oranges, the ends in green, red and brown.
STATE_COLOURS: Final[dict[JobState, str]] = {
    S.CREATED: "#c7c7c7",
    S.AWAITING_PARENTS: "#7f7f7f",
    S.READY: "#dbdb8d",
    S.STAGED_IN: "#bcbd22",
    S.PREPROCESSED: "#9edae5",
    S.RUNNING: "#1f77b4",
    S.RUN_DONE: "#aec7e8",
    S.RUN_ERROR: "#ff9896",
    S.RUN_TIMEOUT: "#ff7f0e",
    S.RESTART_READY: "#ffbb78",
    S.POSTPROCESSED: "#c5b0d5",
    S.STAGED_OUT: "#9467bd",
    S.JOB_FINISHED: "#2ca02c",
    S.FAILED: "#d62728",
    S.KILLED: "#8c564b",
}
# Stacked from the bottom: the ends first (they only grow), then the way back up.
STACK_ORDER: Final = tuple(reversed(JobState))


@dataclass(frozen=True, slots=True)
class JobsInState:
    """``mean[state][i]``: the mean number of jobs in ``state`` during bin ``i``."""

    bins: Bins
    mean: dict[JobState, tuple[float, ...]]  # in STACK_ORDER; states no job was in left out


def edges(bins: Bins) -> list[float]:
    """The bins' edges in seconds from their start: every bin drawn its full width."""
    return [i * bins.width for i in range(bins.count + 1)]


def jobs_in_state(jobs: Iterable[JobTimeline], window: Window, bins: Bins) -> JobsInState:
    stays: dict[JobState, list[tuple[float, float, float]]] = defaultdict(list)
    end = window.end
    for job in jobs:
        entries = job.entries
        for entry, following in zip(entries, [*entries[1:], None], strict=True):
            leaves = end if following is None else following.at
            if leaves > entry.at or following is None:
                stays[entry.state].append((entry.at, leaves, 1.0))
    mean = {state: tuple(time_average(stays[state], bins, end))
            for state in STACK_ORDER if state in stays}  # fmt: skip
    return JobsInState(bins, {s: m for s, m in mean.items() if any(m)})
