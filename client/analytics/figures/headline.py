"""The figures a reader asks first: how many jobs, how long, how fast, how busy.

The makespan runs from the first ``job.created`` to the last job's arrival in its final
state (None while a job has not reached one, or when none was selected); jobs per second
are the jobs that finished (JOB_FINISHED) over it. Utilization is the window's busy over
provisioned node-seconds (:attr:`Utilization.overall`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lodestream.client.analytics.figures.utilization import Utilization
from lodestream.client.analytics.timeline import JobTimeline
from lodestream.schemas.states import JobState


@dataclass(frozen=True, slots=True)
class Headline:
    jobs: int
    finished: int
    failed: int
    makespan_s: float | None
    utilization: float | None

    @property
    def jobs_per_s(self) -> float | None:
        if not self.makespan_s:
            return None
        return self.finished / self.makespan_s


def headline(jobs: Sequence[JobTimeline], utilization: Utilization) -> Headline:
    finals = [job.final_at for job in jobs]
    makespan = None
    if jobs and all(f is not None for f in finals):
        makespan = max(f for f in finals if f is not None) - min(j.created_at for j in jobs)
    finished = sum(1 for job in jobs if job.state is JobState.JOB_FINISHED)
    failed = sum(1 for job in jobs if job.state is JobState.FAILED)
    return Headline(len(jobs), finished, failed, makespan, utilization.overall)
