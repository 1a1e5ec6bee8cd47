"""Stage latencies of finished jobs: the Balsam paper's Table 1, in this state machine.

For every job that reached JOB_FINISHED, from the latest entry into each state (so a job
that was reset and ran again is measured on the pass that finished it):

========================  =====================================================
stage in                  READY → STAGED_IN
run delay                 runnable (PREPROCESSED or RESTART_READY) → RUNNING
run                       RUNNING → RUN_DONE
stage out                 POSTPROCESSED → STAGED_OUT
time to solution          CREATED → JOB_FINISHED
overhead                  time to solution - run
========================  =====================================================

A step with nothing to do is recorded inside a later event (zero time): stage in and stage
out count such jobs as *skipped* and measure only the jobs that performed the step, so a
workload without staging does not show a 0 s stage-in mean that means nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from lodestream.client.analytics.figures.common import Unavailable
from lodestream.client.analytics.stats import Spread, spread
from lodestream.client.analytics.timeline import JobTimeline
from lodestream.schemas.states import RUNNABLE, JobState

S = JobState
STAGES: Final = ("stage in", "run delay", "run", "stage out", "time to solution", "overhead")
DEFINITIONS: Final = {
    "stage in": "READY → STAGED_IN",
    "run delay": "PREPROCESSED (or RESTART_READY) → RUNNING",
    "run": "RUNNING → RUN_DONE",
    "stage out": "POSTPROCESSED → STAGED_OUT",
    "time to solution": "CREATED → JOB_FINISHED",
    "overhead": "time to solution - run",
}
_STEPS: Final = {"stage in": (S.READY, S.STAGED_IN), "stage out": (S.POSTPROCESSED, S.STAGED_OUT)}


@dataclass(frozen=True, slots=True)
class StageRow:
    stage: str
    definition: str
    spread: Spread | None  # None: no finished job performed the step
    skipped: int  # finished jobs for which the step had nothing to do


@dataclass(frozen=True, slots=True)
class StageTable:
    finished_jobs: int
    rows: tuple[StageRow, ...]

    def row(self, stage: str) -> StageRow:
        return next(r for r in self.rows if r.stage == stage)


def stage_samples(jobs: Iterable[JobTimeline]) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Per stage, the seconds each finished job spent in it; and per step, the jobs skipping it."""
    samples: dict[str, list[float]] = {stage: [] for stage in STAGES}
    skipped = dict.fromkeys(_STEPS, 0)
    steps = list(_STEPS.items())
    # A member of an enum costs a lookup through its class each time it is named: this runs
    # for every finished job, so the states are named once.
    finished_state, running_state, done_state, created_state = (
        S.JOB_FINISHED, S.RUNNING, S.RUN_DONE, S.CREATED)  # fmt: skip
    for job in jobs:
        if job.state is not finished_state:
            continue
        # The latest entry into each state, as JobTimeline.last finds it, in one pass.
        last = {entry.state: entry for entry in job.entries}
        get = last.get
        for stage, (first, second) in steps:
            begin, end = get(first), get(second)
            if begin is None or end is None:
                continue
            if begin.seq == end.seq:
                skipped[stage] += 1
            else:
                samples[stage].append(end.at - begin.at)
        running, done = get(running_state), get(done_state)
        finished, created = get(finished_state), get(created_state)
        if running is not None:
            runnable = job.last_of(RUNNABLE, running.seq)
            if runnable is not None:
                samples["run delay"].append(running.at - runnable.at)
        run = done.at - running.at if running is not None and done is not None else None
        if run is not None:
            samples["run"].append(run)
        if finished is not None and created is not None:
            solution = finished.at - created.at
            samples["time to solution"].append(solution)
            if run is not None:
                samples["overhead"].append(solution - run)
    return samples, skipped


def stage_table(jobs: Iterable[JobTimeline]) -> StageTable | Unavailable:
    samples, skipped = stage_samples(jobs)
    finished = len(samples["time to solution"])
    if finished == 0:
        return Unavailable("no job of the selection finished: Table 1 needs finished jobs")
    return StageTable(
        finished,
        tuple(
            StageRow(stage, DEFINITIONS[stage], spread(samples[stage]), skipped.get(stage, 0))
            for stage in STAGES
        ),
    )
