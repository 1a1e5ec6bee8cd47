"""Node utilization over time: nodes busy running jobs against nodes provisioned.

Busy: each run (``job.started`` to the event reporting its end, or the window's end) weighs
the job's nodes (``num_nodes / node_packing_count``). Provisioned: each pilot session's
nodes from ``session.opened`` to its end. Allocated: each pilot batch job's nodes while the
scheduler reported it running (from ``batch.running`` to ``batch.finished``). All three are
time averages per bin, in nodes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from lodestream.client.analytics.pilots import BatchInterval, SessionInterval
from lodestream.client.analytics.timeline import JobTimeline
from lodestream.client.analytics.window import Bins, Window, time_average


@dataclass(frozen=True, slots=True)
class Utilization:
    bins: Bins
    busy: tuple[float, ...]  # mean nodes running jobs, per bin
    provisioned: tuple[float, ...]  # mean nodes held by pilot sessions
    allocated: tuple[float, ...]  # mean nodes of batch jobs running
    busy_node_s: float  # over the window
    provisioned_node_s: float
    allocated_node_s: float

    @property
    def overall(self) -> float | None:
        """Busy over provisioned node-seconds (None: no pilot session in the window)."""
        return self.busy_node_s / self.provisioned_node_s if self.provisioned_node_s else None


def run_intervals(jobs: Iterable[JobTimeline], end: float) -> list[tuple[float, float, float]]:
    """``(start, stop, nodes)`` of every run; a run still going stops at ``end``."""
    return [
        (run.started_at, run.ended_at if run.ended_at is not None else end, job.nodes)
        for job in jobs
        for run in job.runs
    ]


def utilization(
    jobs: Iterable[JobTimeline],
    sessions: Iterable[SessionInterval],
    batches: Iterable[BatchInterval],
    window: Window,
    bins: Bins,
) -> Utilization:
    end = window.end
    busy = run_intervals(jobs, end)
    held = [(s.opened_at, s.ended_at if s.ended_at is not None else end, float(s.nodes))
            for s in sessions]  # fmt: skip
    allocated = [
        (b.running_at, b.finished_at if b.finished_at is not None else end, float(b.num_nodes))
        for b in batches
        if b.running_at is not None
    ]
    return Utilization(
        bins=bins,
        busy=tuple(time_average(busy, bins, end)),
        provisioned=tuple(time_average(held, bins, end)),
        allocated=tuple(time_average(allocated, bins, end)),
        busy_node_s=_node_seconds(busy, window),
        provisioned_node_s=_node_seconds(held, window),
        allocated_node_s=_node_seconds(allocated, window),
    )


def _node_seconds(intervals: list[tuple[float, float, float]], window: Window) -> float:
    return math.fsum(_inside(start, stop, window.start, window.end) * weight
                     for start, stop, weight in intervals)  # fmt: skip


def _inside(start: float, stop: float, low: float, high: float) -> float:
    """max(0, min(stop, high) - max(start, low)), written as the comparisons min and max make
    (the same one of the two, ties included): faster than the calls, for every run."""
    overlap = (high if high < stop else stop) - (low if low > start else start)
    return overlap if overlap > 0.0 else 0.0
