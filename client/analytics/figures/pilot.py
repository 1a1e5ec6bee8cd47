"""Pilot overhead of each run the pilot reported: lease → process start, run end → reported.

=======================  =====================================================================
lease → start            the process started (``started_at``) - the lease (``leased_at``)
spawn → start            ``started_at - spawning_at``: making the process (stamped runs only)
run end → reported       the result event's time - ``exited_at``: from the exit to its report
=======================  =====================================================================

Where the pilot's own stamps (:mod:`~lodestream.client.analytics.pilot_times`) are missing
(pilots older than them) the events' times stand in: the lease is a separate ``job.leased``
event's time or else ``job.started``'s (which *is* the lease), the start is ``job.started``'s
time, and the exit is the start plus the ``runtime_s`` the pilot measured. Each row says
how many runs had real stamps.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from lodestream.client.analytics.figures.common import Unavailable
from lodestream.client.analytics.stats import Spread, spread
from lodestream.client.analytics.timeline import JobTimeline, RunRecord


@dataclass(frozen=True, slots=True)
class OverheadRow:
    step: str
    spread: Spread
    stamped: int  # runs measured with the pilot's own stamps; the rest from event times


@dataclass(frozen=True, slots=True)
class PilotOverhead:
    runs: int
    rows: tuple[OverheadRow, ...]

    def row(self, step: str) -> OverheadRow:
        return next(r for r in self.rows if r.step == step)


def lease_to_start(run: RunRecord) -> tuple[float, bool]:
    """Seconds from lease to process start, and whether both ends are pilot stamps."""
    stamps = run.stamps
    lease = stamps.leased_at
    if lease is None:
        lease = run.lease_event_at if run.lease_event_at is not None else run.started_at
    start = stamps.started_at if stamps.started_at is not None else run.started_at
    return start - lease, stamps.leased_at is not None and stamps.started_at is not None


def spawn_to_start(run: RunRecord) -> tuple[float, bool] | None:
    """Seconds the pilot took to make the process (only from its own stamps)."""
    stamps = run.stamps
    if stamps.spawning_at is None or stamps.started_at is None:
        return None
    return stamps.started_at - stamps.spawning_at, True


def end_to_report(run: RunRecord) -> tuple[float, bool] | None:
    """Seconds from the process's exit to the event reporting it (None: nothing to go by)."""
    if run.ended_at is None:
        return None
    if run.stamps.exited_at is not None:
        return run.ended_at - run.stamps.exited_at, True
    if run.runtime_s is None:
        return None
    start = run.stamps.started_at if run.stamps.started_at is not None else run.started_at
    return run.ended_at - (start + run.runtime_s), False


def pilot_overhead(jobs: Iterable[JobTimeline]) -> PilotOverhead | Unavailable:
    runs = [run for job in jobs for run in job.runs if run.reported_by_pilot]
    if not runs:
        return Unavailable("no run was reported by a pilot in the selection")
    starts = [lease_to_start(run) for run in runs]
    spawns = [s for s in (spawn_to_start(run) for run in runs) if s is not None]
    ends = [e for e in (end_to_report(run) for run in runs) if e is not None]
    rows = [_row("lease → start", starts)]
    if spawns:
        rows.append(_row("spawn → start", spawns))
    if ends:
        rows.append(_row("run end → reported", ends))
    return PilotOverhead(len(runs), tuple(rows))


def _row(step: str, measured: list[tuple[float, bool]]) -> OverheadRow:
    found = spread([seconds for seconds, _ in measured])
    assert found is not None  # measured is never empty here
    return OverheadRow(step, found, sum(1 for _, stamped in measured if stamped))
