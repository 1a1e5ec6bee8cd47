"""The controller's decisions: pure functions from facts to the events they imply.

Each function takes the event that caused it (with its stream sequence) and
whatever state it needs, and returns :class:`Append` commands: an event and
the aggregate sequence it must follow (compare-and-set). Ids are derived
from the cause, so deciding twice yields the very same events — which is
what makes a restarted controller re-emit nothing new.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from lodestream.eventlog.kernel import Append
from lodestream.schemas.envelope import Event
from lodestream.schemas.events import (
    JobAwaitingParents,
    JobFailed,
    JobFinished,
    JobLeaseExpired,
    JobPostprocessed,
    JobPreprocessed,
    JobReady,
    JobRunTimedOut,
    JobStagedIn,
    SessionExpired,
)
from lodestream.schemas.events.job import (
    FailureData,
    FinishedData,
    LeaseData,
    ParentsData,
    RunResultData,
    StepData,
)
from lodestream.schemas.events.session import SessionExpiredData
from lodestream.schemas.ids import derived_id
from lodestream.schemas.resources import App, JobSpec, JobSteps
from lodestream.schemas.states import JobState

ACTOR = "controller:main"
FAILED_STATES = frozenset({JobState.FAILED, JobState.KILLED})


@dataclass(frozen=True, slots=True)
class LeasedJob:
    """A job held by a session, as the read model shows it."""

    id: uuid.UUID
    state: JobState
    last_seq: int
    attempt: int
    spec: JobSpec


def _id(cause: uuid.UUID | str, kind: str, target: uuid.UUID | str) -> uuid.UUID:
    return derived_id(str(cause), "controller", kind, str(target))


def _stages(spec: JobSpec, app: App | None) -> JobSteps:
    """The optional steps of ``spec`` at its app (none while the app is unknown)."""
    return app.steps(spec) if app is not None else JobSteps()


def advance(
    cause: Event, job_id: uuid.UUID, seq: int, spec: JobSpec, app: App | None, *, from_ready: bool
) -> list[Append]:
    """Move a job that may start (no unfinished parents) to its next real step.

    A READY job with files to stage in is the site transfer module's to move.
    """
    stage_in, preprocess, _, _ = _stages(spec, app)
    ready = () if from_ready else ("job.ready",)
    event: Event
    if stage_in and not from_ready:
        event = JobReady.create(
            site=spec.site, aggregate_id=job_id, actor=ACTOR,
            event_id=_id(cause.id, "job.ready", job_id), causation_id=cause.id,
        )  # fmt: skip
    elif stage_in:
        return []
    elif preprocess:
        event = JobStagedIn.create(
            site=spec.site, aggregate_id=job_id, actor=ACTOR,
            data=StepData(skipped=ready, work=spec),
            event_id=_id(cause.id, "job.staged_in", job_id), causation_id=cause.id,
        )  # fmt: skip
    else:
        event = JobPreprocessed.create(
            site=spec.site, aggregate_id=job_id, actor=ACTOR,
            data=StepData(skipped=(*ready, "job.staged_in"), work=spec),
            event_id=_id(cause.id, "job.preprocessed", job_id), causation_id=cause.id,
        )  # fmt: skip
    return [Append(event, seq)]


def on_created_or_waiting(
    cause: Event,
    job_id: uuid.UUID,
    seq: int,
    spec: JobSpec,
    app: App | None,
    *,
    parents: Mapping[uuid.UUID, JobState],
    waiting: bool,
) -> list[Append]:
    """job.created or job.awaiting_parents: wait, fail with a parent, or go on."""
    if spec.parent_ids:
        missing = [p for p in spec.parent_ids if p not in parents]
        failed = [p for p in spec.parent_ids if parents.get(p) in FAILED_STATES]
        if missing or failed:
            parent = (failed or missing)[0]
            why = "not found" if parent in missing else parents[parent].value
            reason = f"parent {parent} {why}"
            return [fail_child(cause, job_id, seq, site=spec.site, parent=parent, reason=reason)]
        if any(parents[p] != JobState.JOB_FINISHED for p in spec.parent_ids):
            if waiting:
                return []
            event = JobAwaitingParents.create(
                site=spec.site, aggregate_id=job_id, actor=ACTOR,
                data=ParentsData(parent_ids=spec.parent_ids),
                event_id=_id(cause.id, "job.awaiting_parents", job_id), causation_id=cause.id,
            )  # fmt: skip
            return [Append(event, seq)]
    return advance(cause, job_id, seq, spec, app, from_ready=False)


def fail_child(
    cause: Event, job_id: uuid.UUID, seq: int, *, site: str, parent: uuid.UUID, reason: str
) -> Append:
    event = JobFailed.create(
        site=site, aggregate_id=job_id, actor=ACTOR,
        data=FailureData(reason=reason, cause=(f"parent {parent}",), parent_id=parent),
        event_id=_id(cause.id, "job.failed", job_id), causation_id=cause.id,
    )  # fmt: skip
    return Append(event, seq)


def on_run_done(cause: Event, seq: int, spec: JobSpec, app: App | None) -> list[Append]:
    """No postprocess hook: finish (or hand to stage-out); otherwise the site's turn."""
    _, _, postprocess, stage_out = _stages(spec, app)
    if postprocess:
        return []
    job_id = cause.aggregate_id
    if stage_out:
        event: Event = JobPostprocessed.create(
            site=spec.site, aggregate_id=job_id, actor=ACTOR,
            data=StepData(note="no postprocess hook", work=spec),
            event_id=_id(cause.id, "job.postprocessed", job_id), causation_id=cause.id,
        )  # fmt: skip
    else:
        event = JobFinished.create(
            site=spec.site, aggregate_id=job_id, actor=ACTOR,
            data=FinishedData(skipped=("job.postprocessed", "job.staged_out"), work=spec),
            event_id=_id(cause.id, "job.finished", job_id), causation_id=cause.id,
        )  # fmt: skip
    return [Append(event, seq)]


def on_postprocessed(cause: Event, seq: int, spec: JobSpec, app: App | None) -> list[Append]:
    if _stages(spec, app).stage_out:
        return []  # the site transfer module stages out
    job_id = cause.aggregate_id
    event = JobFinished.create(
        site=spec.site, aggregate_id=job_id, actor=ACTOR,
        data=FinishedData(skipped=("job.staged_out",), work=spec),
        event_id=_id(cause.id, "job.finished", job_id), causation_id=cause.id,
    )  # fmt: skip
    return [Append(event, seq)]


def on_staged_out(cause: Event, seq: int, spec: JobSpec) -> list[Append]:
    job_id = cause.aggregate_id
    event = JobFinished.create(
        site=cause.site, aggregate_id=job_id, actor=ACTOR, data=FinishedData(work=spec),
        event_id=_id(cause.id, "job.finished", job_id), causation_id=cause.id,
    )  # fmt: skip
    return [Append(event, seq)]


def on_parent_done(
    cause: Event,
    children: Iterable[tuple[uuid.UUID, int, JobSpec]],
    parents: Mapping[uuid.UUID, JobState],
    apps: Mapping[tuple[str, str], App],
) -> list[Append]:
    """A parent finished, failed or was killed: release or fail its waiting children."""
    appends: list[Append] = []
    for child_id, child_seq, spec in children:
        appends += on_created_or_waiting(
            cause, child_id, child_seq, spec, apps.get((spec.site, spec.app)),
            parents=parents, waiting=True,
        )  # fmt: skip
    return appends


def on_session_expired(
    site: str,
    session_id: uuid.UUID,
    marker_seq: int,
    held: Iterable[LeasedJob],
    at: datetime,
    *,
    batch: str | None = None,
    session_seq: int | None = 0,
) -> list[Append]:
    """Fence a dead session: unstarted leases expire, running jobs time out.

    ``batch`` is the batch job the session ran in, as the read model shows it (see
    ``ReadModel.session_batch``): the next link of a timed-out run's cause chain.
    ``session_seq`` is the sequence of the session's newest event (0: it never opened),
    on which ``session.expired`` is compare-and-set: a pilot opening or closing it
    meanwhile wins, and the expiry is decided again. None: the session already ended
    (closed by its pilot, whose last heartbeat then ages out as any does, or expired by an
    earlier marker); only what it still holds is fenced.
    """
    cause = derived_id("hb-expired", site, str(session_id), str(marker_seq))
    appends: list[Append] = []
    expired = timed_out = 0
    reason = f"session {session_id} heartbeat expired"
    chain = (reason, batch) if batch else (reason,)
    for job in held:
        if job.state == JobState.RUNNING:
            timed_out += 1
            event: Event = JobRunTimedOut.create(
                site=site, aggregate_id=job.id, actor=ACTOR, occurred_at=at,
                data=RunResultData(cause=chain, work=job.spec, attempt=job.attempt),
                event_id=_id(cause, f"job.run_timed_out@{job.last_seq}", job.id),
                causation_id=cause,
            )  # fmt: skip
        else:
            expired += 1
            event = JobLeaseExpired.create(
                site=site, aggregate_id=job.id, actor=ACTOR, occurred_at=at,
                data=LeaseData(session_id=session_id, reason="; ".join(chain), work=job.spec,
                               attempt=job.attempt),
                event_id=_id(cause, f"job.lease_expired@{job.last_seq}", job.id),
                causation_id=cause,
            )  # fmt: skip
        appends.append(Append(event, job.last_seq))
    if session_seq is None:
        return appends
    appends.append(
        Append(
            SessionExpired.create(
                site=site, aggregate_id=session_id, actor=ACTOR, occurred_at=at,
                data=SessionExpiredData(leases_expired=expired, runs_timed_out=timed_out),
                event_id=_id(cause, "session.expired", session_id), causation_id=cause,
            ),
            session_seq,
        )
    )  # fmt: skip
    return appends
