"""Every figure of one analysis, computed once from the timelines: :func:`summarize`.

The window runs from ``since`` (or the first folded event) to ``until`` (or the last one).
A figure the selection cannot give is an :class:`Unavailable` with its reason; a selection
that holds no job and no pilot at all (or no job, when the filters are about jobs: apps and
tags) is :class:`NothingSelected`, worded by why (nothing read, everything refused, or
filters that match nothing).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from lodestream.client.analytics.errors import NothingSelected
from lodestream.client.analytics.figures.backlog import Backlog, backlog
from lodestream.client.analytics.figures.common import Unavailable
from lodestream.client.analytics.figures.failures import (
    AppFailure,
    FailureGroup,
    failures_by_app,
    failures_by_cause,
)
from lodestream.client.analytics.figures.headline import Headline, headline
from lodestream.client.analytics.figures.latency import StageTable, stage_table
from lodestream.client.analytics.figures.little import LittleRow, littles_law
from lodestream.client.analytics.figures.pilot import PilotOverhead, pilot_overhead
from lodestream.client.analytics.figures.throughput import Throughput, throughput
from lodestream.client.analytics.figures.utilization import Utilization, utilization
from lodestream.client.analytics.fold import FoldCounts, Timelines
from lodestream.client.analytics.intake import IntakeReport
from lodestream.client.analytics.selection import Selection
from lodestream.client.analytics.window import Bins, Window
from lodestream.collector import collector_paused


@dataclass(frozen=True, slots=True)
class Loaded:
    """What a replay produced: the timelines, and what was read and refused on the way."""

    timelines: Timelines
    intake: IntakeReport
    selection: Selection


@dataclass(frozen=True, slots=True)
class Summary:
    selection: Selection
    intake: IntakeReport
    counts: FoldCounts
    window: Window
    jobs_by_state: dict[str, int]
    sessions: int
    batch_jobs: int
    throughput: Throughput
    utilization: Utilization
    stages: StageTable | Unavailable
    pilot: PilotOverhead | Unavailable
    little: tuple[LittleRow, ...] | Unavailable
    failures: tuple[FailureGroup, ...]
    backlog: Backlog
    headline: Headline
    failures_by_app: tuple[AppFailure, ...]

    @property
    def jobs(self) -> int:
        return sum(self.jobs_by_state.values())


def window_of(loaded: Loaded) -> Window:
    timelines, selection = loaded.timelines, loaded.selection
    start = selection.since if selection.since is not None else timelines.first_at
    end = selection.until if selection.until is not None else timelines.last_at
    if start is None or end is None:
        raise _nothing(loaded)
    return Window(start, max(start, end))


def summarize(
    loaded: Loaded, bin_s: float | None = None, steady: tuple[float, float] | None = None
) -> Summary:
    """Every figure of ``loaded``; ``bin_s`` fixes the width of the time bins, ``steady`` the
    window of Little's law (seconds from the window's start; default: the run's middle half)."""
    timelines, selection = loaded.timelines, loaded.selection
    # Pilots without jobs are worth showing (idle nodes), unless the filters were about jobs.
    if timelines.empty or (not timelines.jobs and (selection.apps or selection.tags)):
        raise _nothing(loaded)
    window = window_of(loaded)
    bins = Bins.over(window, bin_s)
    with collector_paused():
        return _figures(loaded, window, bins, steady)


def _figures(
    loaded: Loaded, window: Window, bins: Bins, steady: tuple[float, float] | None
) -> Summary:
    timelines = loaded.timelines
    jobs = list(timelines.jobs.values())
    sessions, batches = timelines.sessions.values(), timelines.batches.values()
    used = utilization(jobs, sessions, batches, window, bins)
    return Summary(
        selection=loaded.selection,
        intake=loaded.intake,
        counts=timelines.counts,
        window=window,
        jobs_by_state=dict(Counter(job.state.value for job in jobs).most_common()),
        sessions=len(timelines.sessions),
        batch_jobs=len(timelines.batches),
        throughput=throughput(jobs, window, bins),
        utilization=used,
        stages=stage_table(jobs),
        pilot=pilot_overhead(jobs),
        little=littles_law(jobs, window, steady),
        failures=failures_by_cause(jobs),
        backlog=backlog(jobs, window, bins),
        headline=headline(jobs, used),
        failures_by_app=failures_by_app(jobs),
    )


def _nothing(loaded: Loaded) -> NothingSelected:
    intake, counts, selection = loaded.intake, loaded.timelines.counts, loaded.selection
    if intake.read == 0:
        return NothingSelected(
            "no event in the range read (" + selection.describe() + "): the log is empty "
            "there; start earlier (--since 1 reads everything)"
        )
    if intake.accepted == 0:
        return NothingSelected(
            f"all {intake.read:,} events read were refused by the shared rule; nothing to "
            "analyse (the refusals are listed with --json)"
        )
    what = "no job" if selection.apps or selection.tags else "no job or pilot"
    words = f"{intake.read:,} events read, but {what} matches ({selection.describe()})"
    if counts.begun_before:
        words += (
            f"; {counts.begun_before:,} events belong to jobs or pilots created before the "
            "range read (start earlier to include them)"
        )
    return NothingSelected(words)
