"""A run as the simulator needs it: each job's parents, its runs (one per attempt, with the
wait its retry policy imposed), its end; each pilot's opening and shape.

Folded from typed events (whatever their source) so that a source of events (a file, the
API's feed, a live read) can replace another without touching the model. Times are POSIX
seconds (the producers' ``occurred_at``).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from lodestream.schemas.envelope import Event
from lodestream.schemas.events import (
    JobCreated,
    JobFailed,
    JobFinished,
    JobLeaseExpired,
    JobLeaseReleased,
    JobPreprocessed,
    JobRestartReady,
    JobRunDone,
    JobRunErrored,
    JobRunTimedOut,
    JobStarted,
    SessionOpened,
)
from lodestream.schemas.events.job import RunResultData
from lodestream.schemas.events.scaler import ScalerDecided

RUNNABLE_EVENTS = (JobPreprocessed, JobRestartReady)
_RESULTS = (JobRunDone, JobRunErrored, JobRunTimedOut)


@dataclass(frozen=True, slots=True)
class RecordedRun:
    """One attempt: runnable, not leased before ``eligible`` (its retry's ``retry_at``),
    leased, reported."""

    runnable: float  # job.preprocessed (or job.created runnable) or job.restart_ready
    eligible: float  # max(runnable, retry_at): the retry policy's backoff ends
    started: float  # job.started: the lease
    result: float  # the run's result event (job.run_*, or the pilot's job.finished)
    session: uuid.UUID
    hosts: tuple[str, ...]  # the placement's nodes, when the pilot recorded one
    run_s: float  # the process's own run time (profile, else runtime_s, else the span)

    @property
    def held_s(self) -> float:
        """What the run held its slot for, lease to result: the process and the pilot's
        spawn and report around it."""
        return max(self.result - self.started, self.run_s)


@dataclass(frozen=True, slots=True)
class RecordedJob:
    """One job that reached a final state (JOB_FINISHED or FAILED), with its runs in order."""

    job_id: uuid.UUID
    site: str
    app: str
    num_nodes: int
    per_node: int  # how many such jobs share a node: its node_packing_count
    ranks_per_node: int
    parents: tuple[uuid.UUID, ...]
    created: float
    first_runnable: float  # its first runnable event; its end if it never became runnable
    runs: tuple[RecordedRun, ...]
    ended: float  # job.finished or job.failed
    failed: bool

    # The last run's figures, which a one-run job is described by.
    @property
    def runnable(self) -> float:
        return self.runs[-1].runnable if self.runs else self.first_runnable

    @property
    def started(self) -> float:
        return self.runs[-1].started

    @property
    def result(self) -> float:
        return self.runs[-1].result

    @property
    def finished(self) -> float:
        return self.ended

    @property
    def session(self) -> uuid.UUID:
        return self.runs[-1].session

    @property
    def run_s(self) -> float:
        return self.runs[-1].run_s

    @property
    def held_s(self) -> float:
        return self.runs[-1].held_s


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
    unfinished: int = 0  # jobs seen that never reached a final state (not replayed)


@dataclass(slots=True)
class _Partial:
    site: str
    app: str = ""
    num_nodes: int = 1
    per_node: int = 1
    ranks_per_node: int = 1
    parents: tuple[uuid.UUID, ...] = ()
    tags: Mapping[str, str] = field(default_factory=dict)
    created: float | None = None
    first_runnable: float | None = None
    runnable: float | None = None
    eligible: float | None = None
    started: float | None = None
    session: uuid.UUID | None = None
    hosts: tuple[str, ...] = ()
    runs: list[RecordedRun] = field(default_factory=list)
    ended: float | None = None
    failed: bool = False


def _t(moment: datetime) -> float:
    return moment.timestamp()


def recording(
    events: Iterable[Event],
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    apps: Collection[str] = (),
    tags: Mapping[str, str] | None = None,
) -> Recording:
    """Fold ``events`` (log order, each checked by the shared trust rule) into a recording.

    ``since``/``until``: only jobs created in that range (and pilots opened by ``until``);
    ``apps``: only jobs of these apps; ``tags``: only jobs with all of these tags.
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
    low = since.timestamp() if since is not None else -float("inf")
    high = until.timestamp() if until is not None else float("inf")
    out.pilots = [p for p in out.pilots if p.opened <= high]
    for (_, job_id), job in jobs.items():
        done = _done(job_id, job)
        if done is None:
            out.unfinished += job.created is not None and low <= job.created <= high
        elif (
            low <= done.created <= high
            and (not apps or done.app in apps)
            and all(job.tags.get(k) == v for k, v in (tags or {}).items())
        ):
            out.jobs.append(done)
    out.jobs.sort(key=lambda j: j.created)
    return out


def _apply(job: _Partial, event: Event) -> None:
    at = _t(event.occurred_at)
    match event:
        case JobCreated(data=spec):
            job.created, job.app, job.num_nodes = at, spec.app, spec.num_nodes
            job.per_node, job.ranks_per_node = spec.node_packing_count, spec.ranks_per_node
            job.parents, job.tags = tuple(spec.parent_ids), dict(spec.tags)
            if event.runnable:
                _runnable(job, at, at)
        case JobPreprocessed():
            _runnable(job, at, at)
        case JobRestartReady(data=retry):
            due = _t(retry.retry_at) if retry.retry_at is not None else at
            _runnable(job, at, max(at, due))
        case JobLeaseReleased() | JobLeaseExpired():
            _runnable(job, at, at)  # the lease came to nothing: runnable again, same attempt
        case JobStarted(data=started):
            job.started, job.session = at, started.session_id
            job.hosts = tuple(p.hostname for p in started.placement)
        case JobRunDone(data=run) | JobRunErrored(data=run) | JobRunTimedOut(data=run):
            _ran(job, at, run)
        case JobFinished(data=finished):
            if finished.run is not None:  # the pilot's job.finished stands for run_done too
                _ran(job, at, finished.run)
            job.ended = at
        case JobFailed():
            job.ended, job.failed = at, True


def _runnable(job: _Partial, at: float, eligible: float) -> None:
    job.first_runnable = at if job.first_runnable is None else job.first_runnable
    job.runnable, job.eligible, job.started = at, eligible, None


def _ran(job: _Partial, at: float, run: RunResultData) -> None:
    if job.started is None or job.session is None:
        return  # a result without its lease in the range: nothing to replay
    runnable = job.runnable if job.runnable is not None else job.started
    eligible = job.eligible if job.eligible is not None else runnable
    job.runs.append(RecordedRun(
        runnable=min(runnable, job.started), eligible=min(eligible, job.started),
        started=job.started, result=at, session=job.session, hosts=job.hosts,
        run_s=_run_s(job.started, at, run),
    ))  # fmt: skip
    job.started = None


def _done(job_id: uuid.UUID, job: _Partial) -> RecordedJob | None:
    if job.created is None or job.ended is None or (not job.runs and not job.failed):
        return None
    return RecordedJob(job_id=job_id, site=job.site, app=job.app, num_nodes=job.num_nodes,
                       per_node=job.per_node, ranks_per_node=job.ranks_per_node,
                       parents=job.parents, created=job.created,
                       first_runnable=job.first_runnable if job.first_runnable is not None
                       else job.ended, runs=tuple(job.runs), ended=job.ended,
                       failed=job.failed)  # fmt: skip


def _run_s(started: float, result: float, run: RunResultData | None) -> float:
    """The process's run time: the pilot's profile when it recorded one (started → exited),
    else the runtime it measured, else lease to result."""
    profile = run.profile if run is not None else None
    if profile is not None and profile.started_at is not None and profile.exited_at is not None:
        return (profile.exited_at - profile.started_at).total_seconds()
    if run is not None and run.runtime_s is not None:
        return run.runtime_s
    return max(result - started, 0.0)
