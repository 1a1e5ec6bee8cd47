"""Backlog per site over time: jobs in the system that are not running, per bin.

A job is in the system from ``job.created`` until the final state it is in at the end of
the log read; while one of its runs goes on it is running, otherwise it waits (for its
parents, staging, a pilot, a retry...). Time averages per bin, in jobs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from lodestream.client.analytics.figures.utilization import run_intervals
from lodestream.client.analytics.timeline import JobTimeline
from lodestream.client.analytics.window import Bins, Window, time_average


@dataclass(frozen=True, slots=True)
class Backlog:
    bins: Bins
    waiting: dict[str, tuple[float, ...]]  # site → mean jobs waiting, per bin


def backlog(jobs: Iterable[JobTimeline], window: Window, bins: Bins) -> Backlog:
    by_site: dict[str, list[JobTimeline]] = defaultdict(list)
    for job in jobs:
        by_site[job.site].append(job)
    waiting = {}
    for site in sorted(by_site):
        site_jobs = by_site[site]
        stays = [(j.created_at, j.final_at if j.final_at is not None else window.end, 1.0)
                 for j in site_jobs]  # fmt: skip
        in_system = time_average(stays, bins, window.end)
        running = time_average(
            [(a, b, 1.0) for a, b, _ in run_intervals(site_jobs, window.end)], bins, window.end
        )
        waiting[site] = tuple(max(0.0, s - r) for s, r in zip(in_system, running, strict=True))
    return Backlog(bins, waiting)
