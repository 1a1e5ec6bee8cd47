"""Backlog per site over time: jobs in the system that are not running, per bin.

A job is in the system from ``job.created`` until the final state it is in at the end of
the log read; while one of its runs goes on it is running, otherwise it waits (for its
parents, staging, a pilot, a retry...). Time averages per bin, in jobs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

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
    end = window.end
    for site in sorted(by_site):
        site_jobs = by_site[site]
        finals = [j.final_at for j in site_jobs]
        stays = [(j.created_at, final if final is not None else end, 1.0)
                 for j, final in zip(site_jobs, finals, strict=True)]  # fmt: skip
        in_system = time_average(stays, bins, end)
        # The runs of run_intervals, each weighing one job rather than its nodes.
        runs = [(run.started_at, run.ended_at if run.ended_at is not None else end, 1.0)
                for job in site_jobs for run in job.runs]  # fmt: skip
        running = time_average(runs, bins, end)
        waiting[site] = tuple(max(0.0, s - r) for s, r in zip(in_system, running, strict=True))
    return Backlog(bins, waiting)
