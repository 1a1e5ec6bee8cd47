"""What the simulator takes from a recorded run: one :class:`RecordedJob` per job, and the
pilots (:class:`RecordedPilot`) that ran them, folded from typed, already-checked events.

This is the one module that reads events; the rest of the simulator sees only these
dataclasses, so a richer timeline fold can replace it without touching the model. Times are
POSIX seconds (the producers' ``occurred_at``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from lodestream.schemas.envelope import Event
from lodestream.schemas.events import (
    JobCreated,
    JobFinished,
    JobPreprocessed,
    JobRestartReady,
    JobRunDone,
    JobStarted,
    SessionOpened,
)
from lodestream.schemas.events.job import RunResultData
from lodestream.schemas.events.scaler import ScalerDecided

RUNNABLE_EVENTS = (JobPreprocessed, JobRestartReady)


@dataclass(frozen=True, slots=True)
class RecordedJob:
    """One job that ran to JOB_FINISHED, with the times of its steps (its last run's)."""

    job_id: uuid.UUID
    site: str
    app: str
    num_nodes: int
    per_node: int  # how many such jobs share a node: its node_packing_count
    ranks_per_node: int
    created: float
    runnable: float  # its runnable event (the one its successful run was leased from)
    started: float  # job.started: the lease
    result: float  # the run's result event (job.run_done, or the pilot's job.finished)
    finished: float  # job.finished
    session: uuid.UUID
    run_s: float  # the process's own run time (profile, else runtime_s, else the span)

    @property
    def held_s(self) -> float:
        """What the run held its slot for, lease to result: the process and the pilot's
        spawn and report around it."""
        return max(self.result - self.started, self.run_s)


@dataclass(frozen=True, slots=True)
class RecordedPilot:
    """A pilot session: when it opened, and its nodes' cores."""

    session: uuid.UUID
    site: str
    opened: float
    slots_per_node: tuple[int, ...]  # its nodes' cores; the slots they give once calibrated


@dataclass(slots=True)
class Recording:
    jobs: list[RecordedJob] = field(default_factory=list)
    pilots: list[RecordedPilot] = field(default_factory=list)
    decisions: list[ScalerDecided] = field(default_factory=list)
    unfinished: int = 0  # jobs seen that never reached JOB_FINISHED (not replayed)


@dataclass(slots=True)
class _Partial:
    site: str
    app: str = ""
    num_nodes: int = 1
    per_node: int = 1
    ranks_per_node: int = 1
    created: float | None = None
    runnable: float | None = None
    started: float | None = None
    session: uuid.UUID | None = None
    result: float | None = None
    run: RunResultData | None = None
    finished: float | None = None


def _t(moment: datetime) -> float:
    return moment.timestamp()


def recording(events: Iterable[Event], *, since: datetime | None = None) -> Recording:
    """Fold ``events`` (log order, each checked by the shared trust rule) into a recording.

    ``since``: only jobs created at or after it.
    """
    jobs: dict[tuple[str, uuid.UUID], _Partial] = {}
    out = Recording()
    for event in events:
        if isinstance(event, SessionOpened):
            out.pilots.append(RecordedPilot(event.aggregate_id, event.site, _t(event.occurred_at),
                                            tuple(n.cores for n in event.data.nodes)))  # fmt: skip
            continue
        if isinstance(event, ScalerDecided):
            out.decisions.append(event)
            continue
        if event.kind != "job":
            continue
        key = (event.site, event.aggregate_id)
        job = jobs.setdefault(key, _Partial(event.site))
        _apply(job, event)
    for (_, job_id), job in jobs.items():
        done = _done(job_id, job)
        if done is None:
            out.unfinished += job.created is not None
        elif since is None or done.created >= since.timestamp():
            out.jobs.append(done)
    out.jobs.sort(key=lambda j: j.created)
    return out


def _apply(job: _Partial, event: Event) -> None:
    at = _t(event.occurred_at)
    match event:
        case JobCreated(data=spec):
            job.created, job.app, job.num_nodes = at, spec.app, spec.num_nodes
            job.per_node, job.ranks_per_node = spec.node_packing_count, spec.ranks_per_node
            job.runnable = job.runnable if job.runnable is not None else at
        case JobPreprocessed() | JobRestartReady():
            job.runnable = at
        case JobStarted(data=started):
            job.started, job.session = at, started.session_id
            job.result = job.run = None  # a retry: its last run is the one that counts
        case JobRunDone(data=run):
            job.result, job.run = at, run
        case JobFinished(data=finished):
            job.finished = at
            if finished.run is not None:  # the pilot's job.finished stands for run_done too
                job.result, job.run = at, finished.run


def _done(job_id: uuid.UUID, job: _Partial) -> RecordedJob | None:
    if (job.created is None or job.runnable is None or job.started is None
            or job.session is None or job.result is None or job.finished is None):  # fmt: skip
        return None
    run_s = _run_s(job.started, job.result, job.run)
    return RecordedJob(job_id=job_id, site=job.site, app=job.app, num_nodes=job.num_nodes,
                       per_node=job.per_node, ranks_per_node=job.ranks_per_node,
                       created=job.created, runnable=min(job.runnable, job.started),
                       started=job.started, result=job.result, finished=job.finished,
                       session=job.session, run_s=run_s)  # fmt: skip


def _run_s(started: float, result: float, run: RunResultData | None) -> float:
    """The process's run time: the pilot's profile when it recorded one (started → exited),
    else the runtime it measured, else lease to result."""
    profile = run.profile if run is not None else None
    if profile is not None and profile.started_at is not None and profile.exited_at is not None:
        return (profile.exited_at - profile.started_at).total_seconds()
    if run is not None and run.runtime_s is not None:
        return run.runtime_s
    return max(result - started, 0.0)
