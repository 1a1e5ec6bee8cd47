"""The scheduler module's decisions: pure functions from a batch job's events and what the
scheduler says to the event the site appends.

    a request (batch.requested)   → submit | adopt what a crashed try submitted | nothing
    a deletion request            → cancel at the scheduler | end it before it was submitted
    a sync (status, accounting)   → batch.queued | batch.running | batch.finished | nothing
                                    (batch.queued again when the reason it waits changes)

Every event is an :class:`Append`: the event and the sequence it chains on (the batch job's
last, compare-and-set), with an id derived from its cause, so that deciding again after a
crash or a redelivery yields the very same event and the log takes it once.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

from lodestream.eventlog.kernel import Append
from lodestream.platform_adapters.schedulers.base import BatchRecord, BatchStatus
from lodestream.schemas.batch import BatchView
from lodestream.schemas.envelope import Event, EventData
from lodestream.schemas.events import (
    BatchJobFinished,
    BatchJobQueued,
    BatchJobRunning,
    BatchJobSubmitFailed,
    BatchJobSubmitted,
)
from lodestream.schemas.events.batch import (
    BatchFinishedData,
    BatchReasonData,
    BatchSubmittedData,
)
from lodestream.schemas.ids import derived_id
from lodestream.schemas.resources import (
    BATCH_STATE_FOR_SCHEDULER_STATE,
    BatchJobState,
    SchedulerState,
)

JOB_NAME_PREFIX: Final = "lode-"
VANISHED: Final = "vanished from the queue"
MAX_REASON: Final = 2000


def job_name(batch_id: uuid.UUID) -> str:
    """The scheduler's name for the batch job: it carries the id, so a submission whose
    ``batch.submitted`` was never appended (the agent died in between) is found again."""
    return f"{JOB_NAME_PREFIX}{batch_id}"


def find_submitted(statuses: Mapping[str, BatchStatus], batch_id: uuid.UUID) -> str | None:
    """The scheduler id of a job this batch job already has at the scheduler, if any."""
    name = job_name(batch_id)
    found = sorted((s.scheduler_id for s in statuses.values() if s.name == name), key=_numeric)
    return found[0] if found else None


def _numeric(scheduler_id: str) -> tuple[int, str]:
    head = scheduler_id.split(".", 1)[0]
    return (int(head), scheduler_id) if head.isdigit() else (0, scheduler_id)


# --- a request -------------------------------------------------------------------------------


class RequestStep(Enum):
    DONE = "done"  # it ended, or was refused: nothing to do
    TRACK = "track"  # submitted already: sync it from now on
    END_UNSUBMITTED = "end unsubmitted"  # deleted before it was submitted
    SUBMIT = "submit"


def on_request(view: BatchView) -> RequestStep:
    if view.final:
        return RequestStep.DONE
    if view.scheduler_id is not None:
        return RequestStep.TRACK
    if view.deletion_id is not None:
        return RequestStep.END_UNSUBMITTED
    return RequestStep.SUBMIT


class DeletionStep(Enum):
    DONE = "done"
    CANCEL = "cancel"  # at the scheduler; the sync then sees it end
    END_UNSUBMITTED = "end unsubmitted"


def on_deletion(view: BatchView) -> DeletionStep:
    if view.final:
        return DeletionStep.DONE
    return DeletionStep.CANCEL if view.scheduler_id is not None else DeletionStep.END_UNSUBMITTED


@dataclass(frozen=True, slots=True)
class Submission:
    """What to ask the scheduler for, with the site's defaults and fixed options applied."""

    queue: str
    project: str
    options: Mapping[str, str] = field(default_factory=dict)


def plan_submission(
    view: BatchView,
    *,
    queue: str,
    project: str,
    site_options: Mapping[str, str],
    request_options: frozenset[str],
) -> Submission | str:
    """The submission for ``view``'s request, or why the site refuses it.

    A request's option must be one the site lets requests set; the site's own options
    cannot be overridden by a request.
    """
    request = view.request
    refused = sorted(set(request.options) - request_options)
    if refused:
        allowed = ", ".join(sorted(request_options)) or "none"
        return (f"scheduler option {refused[0]!r} is not one this site lets requests set "
                f"(scheduler.request_options: {allowed})")  # fmt: skip
    clash = sorted(set(request.options) & set(site_options))
    if clash:
        return f"scheduler option {clash[0]!r} is fixed by the site ({site_options[clash[0]]!r})"
    return Submission(
        queue=request.queue or queue,
        project=request.project or project,
        options={**site_options, **request.options},
    )


def submitted(view: BatchView, scheduler: str, scheduler_id: str, expect: int) -> Append:
    event = BatchJobSubmitted.create(
        site=view.site, aggregate_id=view.id, actor=_actor(view),
        data=BatchSubmittedData(scheduler_id=scheduler_id, scheduler=scheduler),
        event_id=_caused(view.requested_id, BatchJobSubmitted), causation_id=view.requested_id,
    )  # fmt: skip
    return Append(event, expect)


def submit_failed(view: BatchView, reason: str) -> Append:
    """The scheduler (or the site) refused the pilot; ``reason`` is in their own words."""
    event = BatchJobSubmitFailed.create(
        site=view.site, aggregate_id=view.id, actor=_actor(view),
        data=BatchReasonData(reason=_clip(reason)),
        event_id=_caused(view.requested_id, BatchJobSubmitFailed),
        causation_id=view.requested_id,
    )  # fmt: skip
    return Append(event, view.last_seq)


def ended_unsubmitted(view: BatchView, note: str = "") -> Append:
    """A batch job deleted before it reached the scheduler ends here, cancelled."""
    assert view.deletion_id is not None
    reason = "deleted before it was submitted" + (f"; {note}" if note else "")
    event = BatchJobFinished.create(
        site=view.site, aggregate_id=view.id, actor=_actor(view),
        data=BatchFinishedData(state=SchedulerState.CANCELLED.value, reason=reason),
        event_id=_caused(view.deletion_id, BatchJobFinished), causation_id=view.deletion_id,
    )  # fmt: skip
    return Append(event, view.last_seq)


# --- a sync ----------------------------------------------------------------------------------


def on_status(
    view: BatchView, status: BatchStatus, *, pilot_end: SchedulerState | None = None
) -> Append | None:
    """The event the scheduler's listing of the job calls for; None if nothing changed.

    Only a change is appended: queued and running as the scheduler moves the job (a requeue
    goes back to queued), queued again when the reason it waits changes (Slurm's
    ``Priority``, ``Resources``, ``PartitionNodeLimit``: the one place a user learns why it
    does not start), and its end with the scheduler's exit code, final state and words,
    or as its pilot saw it (``pilot_end``, :func:`ended_as`).
    """
    target = BATCH_STATE_FOR_SCHEDULER_STATE[status.state]
    if target is None:
        return None  # a state the adapter does not know is logged there, never guessed at
    reason = _clip(status.reason)
    if target is view.observed and (target is not BatchJobState.QUEUED or reason == view.reason):
        return None
    if target is BatchJobState.FINISHED:
        state, reason = ended_as(status.state, _words(view, status), pilot_end)
        return _finished(view, state, status.exit_code, reason)
    kind = BatchJobQueued if target is BatchJobState.QUEUED else BatchJobRunning
    return _sync(view, kind, BatchReasonData(reason=reason))


@dataclass(frozen=True, slots=True)
class Absence:
    """What a job missing from the scheduler's listing calls for."""

    append: Append | None
    missed: bool  # one more sync without a trace of it


def on_absent(
    view: BatchView,
    record: BatchRecord | None,
    *,
    misses: int,
    vanish_after: int,
    pilot_end: SchedulerState | None = None,
) -> Absence:
    """A tracked job the scheduler no longer lists: its accounting record says how it ended.

    ``record`` is None when the scheduler keeps no accounting or has no record. After
    ``vanish_after`` syncs without a trace the job is taken to have ended.
    """
    if record is not None and record.final:
        state, reason = ended_as(record.state, _words(view, record), pilot_end)
        return Absence(_finished(view, state, record.exit_code, reason), False)
    if record is not None:
        return Absence(None, False)  # accounting still has it live: between two listings
    if misses + 1 < vanish_after:
        return Absence(None, True)
    scheduler = view.scheduler or "the scheduler"
    reason = f"{VANISHED}: {scheduler} lists no job {view.scheduler_id} and has no record of it"
    return Absence(_finished(view, SchedulerState.UNKNOWN, None, reason), True)


PILOT_DRAINED: Final = "its pilot drained at its wall time"


def ended_as(
    state: SchedulerState, words: str, pilot_end: SchedulerState | None
) -> tuple[SchedulerState, str]:
    """The final state and reason to record: the scheduler's, unless its pilot says more.

    A pilot drains a little before its wall time and exits 0, and the scheduler records the
    job as completed; the jobs the pilot drained name the batch job ``walltime_expired``.
    The batch job says the same, with the scheduler's words kept in its reason. Any other
    end (a failure, a cancellation) is the scheduler's to tell.
    """
    if pilot_end is SchedulerState.WALLTIME_EXPIRED and state is SchedulerState.FINISHED:
        return pilot_end, f"{words}; {PILOT_DRAINED}"
    return state, words


def _finished(view: BatchView, state: SchedulerState, exit_code: int | None, reason: str) -> Append:
    data = BatchFinishedData(exit_code=exit_code, state=state.value, reason=_clip(reason))
    return _sync(view, BatchJobFinished, data)


def _words(view: BatchView, seen: BatchStatus | BatchRecord) -> str:
    """``slurm TIMEOUT: TimeLimit``: the scheduler's own state and reason."""
    head = " ".join(w for w in (view.scheduler, seen.native_state) if w)
    return f"{head}: {seen.reason}" if seen.reason else head


def _sync(view: BatchView, kind: type[Event], data: EventData) -> Append:
    # The id is the decision's: this batch job, this event type, after this sequence.
    event_type = str(getattr(kind, "event_type", ""))
    event = kind.create(
        site=view.site, aggregate_id=view.id, actor=_actor(view), data=data,
        event_id=derived_id(str(view.id), "site", event_type, str(view.last_seq)),
    )  # fmt: skip
    return Append(event, view.last_seq)


def _caused(cause: uuid.UUID, kind: type[Event]) -> uuid.UUID:
    return derived_id(str(cause), "site", str(getattr(kind, "event_type", "")))


def _actor(view: BatchView) -> str:
    return f"site:{view.site}"


def _clip(text: str) -> str:
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"
