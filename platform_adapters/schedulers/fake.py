"""A fake batch scheduler, in memory, for tests of code that uses schedulers (the site agent).

It passes the same shared test suite as the real backends. Each job follows the ``FakeOutcome``
chosen for it at submission: queued for ``queued_s``, running for ``run_s`` (None: until
deleted or out of wall time), then ending with ``exit_code``; a job longer than its wall time
ends ``WALLTIME_EXPIRED`` at it, as a real scheduler would end it. Time is ``clock`` (seconds
since the epoch; pass a hand-driven one to step through states), and a wall-time minute lasts
``seconds_per_minute``. Nothing is run: scripts are only checked to exist.

Tests steer it with ``reject_submissions``, ``unavailable``, ``windows``, ``list_finished``
(False: ended jobs leave ``status`` at once, as from a busy Slurm's queue) and ``finish`` /
``start`` to force a job along, and read what was asked in ``submitted``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from lodestream.platform_adapters.errors import (
    SchedulerUnavailable,
    SubmitRejected,
    UnknownBatchJob,
)
from lodestream.platform_adapters.schedulers.base import (
    BackfillWindow,
    BatchRecord,
    BatchRequest,
    BatchStatus,
    Capabilities,
    Scheduler,
)
from lodestream.schemas.resources import SchedulerState


@dataclass(frozen=True, slots=True)
class FakeOutcome:
    """How a fake job goes. ``run_s=None`` runs until deleted or out of wall time."""

    queued_s: float = 0.0
    run_s: float | None = 0.0
    exit_code: int = 0
    reason: str = ""


@dataclass(slots=True)
class FakeJob:
    scheduler_id: str
    script_path: Path
    request: BatchRequest
    outcome: FakeOutcome
    submitted_at: float
    wall_s: float
    cancelled_at: float | None = None
    forced_start: float | None = None
    forced_end: tuple[float, SchedulerState, int | None] | None = None
    hostnames: tuple[str, ...] = field(default=())

    def start_at(self) -> float:
        return (
            self.forced_start
            if self.forced_start is not None
            else (self.submitted_at + self.outcome.queued_s)
        )

    def end(self) -> tuple[float, SchedulerState, int | None]:
        """When and how the job ends (or would, if nothing else happens first)."""
        start = self.start_at()
        ends: list[tuple[float, SchedulerState, int | None]] = [
            (start + self.wall_s, SchedulerState.WALLTIME_EXPIRED, None)
        ]
        if self.outcome.run_s is not None:
            state = (
                SchedulerState.FINISHED if self.outcome.exit_code == 0 else SchedulerState.FAILED
            )
            ends.append((start + self.outcome.run_s, state, self.outcome.exit_code))
        if self.cancelled_at is not None:
            ends.append((self.cancelled_at, SchedulerState.CANCELLED, None))
        if self.forced_end is not None:
            ends.append(self.forced_end)
        # Earliest wins; at a tie the job's own ending beats the wall time.
        return min(ends, key=lambda end: (end[0], end[1] is SchedulerState.WALLTIME_EXPIRED))


class FakeScheduler(Scheduler):
    """An in-memory scheduler (see the module doc); one instance is one cluster."""

    name = "fake"
    capabilities = Capabilities(backfill=True, accounting=True)

    def __init__(
        self,
        outcome: FakeOutcome | Callable[[Path, BatchRequest], FakeOutcome] | None = None,
        *,
        clock: Callable[[], float] = time.time,
        seconds_per_minute: float = 60.0,
        list_finished: bool = True,
    ) -> None:
        self._outcome = outcome if outcome is not None else FakeOutcome()
        self._clock = clock
        self.seconds_per_minute = seconds_per_minute
        self.list_finished = list_finished
        self.jobs: dict[str, FakeJob] = {}
        self.submitted: list[FakeJob] = []
        self.windows: list[BackfillWindow] = []
        self.unavailable = False
        self._rejection: str | None = None
        self._next_id = 1000

    def reject_submissions(self, message: str | None) -> None:
        """Refuse every submission with ``message`` from now on (None: accept again)."""
        self._rejection = message

    def render_script_header(self, request: BatchRequest) -> str:
        return f"#FAKE nodes={request.nodes} wall_time_min={request.wall_time_min}\n"

    def _check_available(self) -> None:
        if self.unavailable:
            raise SchedulerUnavailable("fake: the scheduler is unavailable (as set by the test)")

    def submit_request(self, script_path: Path, request: BatchRequest) -> str:
        self._check_available()
        if self._rejection is not None:
            raise SubmitRejected(f"fake: {self._rejection}")
        if not script_path.is_file():
            raise SubmitRejected(f"fake: no batch script {script_path}")
        outcome = self._outcome(script_path, request) if callable(self._outcome) else self._outcome
        self._next_id += 1
        job = FakeJob(
            scheduler_id=str(self._next_id),
            script_path=script_path,
            request=request,
            outcome=outcome,
            submitted_at=self._clock(),
            wall_s=request.wall_time_min * self.seconds_per_minute,
            hostnames=tuple(f"fake{i:04d}" for i in range(1, request.nodes + 1)),
        )
        self.jobs[job.scheduler_id] = job
        self.submitted.append(job)
        return job.scheduler_id

    def _view(self, job: FakeJob) -> BatchRecord:
        now = self._clock()
        end_at, end_state, exit_code = job.end()
        start = job.start_at()
        started = start <= now and start < end_at
        if end_at <= now:
            state = end_state
        else:
            state = SchedulerState.RUNNING if started else SchedulerState.QUEUED
        return BatchRecord(
            scheduler_id=job.scheduler_id,
            state=state,
            native_state=state.value,
            start_time=_utc(start) if started else None,
            end_time=_utc(end_at) if end_at <= now else None,
            exit_code=exit_code if end_at <= now else None,
            nodes=job.request.nodes,
            hostnames=job.hostnames if started else (),
            reason=job.outcome.reason,
        )

    def list_jobs(self, ids: tuple[str, ...] | None) -> dict[str, BatchStatus]:
        self._check_available()
        found = {}
        for job_id in self.jobs if ids is None else ids:
            job = self.jobs.get(job_id)
            if job is None:
                continue
            view = self._view(job)
            if view.final and not self.list_finished:
                continue
            until = view.end_time or _utc(self._clock())
            found[job_id] = BatchStatus(
                scheduler_id=job_id,
                state=view.state,
                native_state=view.native_state,
                nodes=view.nodes,
                hostnames=view.hostnames,
                queue=job.request.queue,
                wall_time_min=job.request.wall_time_min,
                start_time=view.start_time,
                elapsed_s=None
                if view.start_time is None
                else int((until - view.start_time).total_seconds()),
                reason=view.reason,
                exit_code=view.exit_code,
                name=job.request.job_name,
            )
        return found

    def delete_job(self, scheduler_id: str) -> bool:
        self._check_available()
        job = self.jobs.get(scheduler_id)
        if job is None or self._view(job).final:
            return False
        job.cancelled_at = self._clock()
        return True

    def backfill_windows(self) -> list[BackfillWindow]:
        self._check_available()
        return list(self.windows)

    def read_accounting(self, scheduler_id: str) -> BatchRecord:
        self._check_available()
        job = self.jobs.get(scheduler_id)
        if job is None:
            raise UnknownBatchJob(f"fake: no job {scheduler_id}")
        return self._view(job)

    def start(self, scheduler_id: str) -> None:
        """Start a queued job now."""
        self.jobs[scheduler_id].forced_start = self._clock()

    def finish(
        self,
        scheduler_id: str,
        state: SchedulerState = SchedulerState.FINISHED,
        exit_code: int | None = 0,
    ) -> None:
        """End a job now, the way given (a node failure: ``FAILED``, ``None``)."""
        self.jobs[scheduler_id].forced_end = (self._clock(), state, exit_code)


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)
