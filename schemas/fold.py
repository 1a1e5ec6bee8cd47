"""``state = fold(events)``: the pure reduction of a job's events to its current view.

``apply`` is the one place a job event is judged legal. Writers call it
before appending (to refuse an illegal transition with a clear error), the
projector calls it when folding (to quarantine anything illegal that did
reach the log), and tests call it exhaustively against the table.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from pydantic import BaseModel

from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import IllegalTransition
from lodestream.schemas.events.job import JobCreated, JobStarted, LeaseData, StartedData
from lodestream.schemas.states import (
    CREATED_RUNNABLE,
    RUN_CARRIERS,
    SKIPPABLE,
    TRANSITIONS,
    JobState,
    Transition,
)


@dataclass(frozen=True, slots=True)
class JobView:
    id: uuid.UUID
    site: str
    state: JobState
    last_seq: int
    lease_seq: int | None = None
    lease_session: uuid.UUID | None = None
    attempts: int = 0
    stage_times: dict[str, datetime] = field(default_factory=dict)  # when each state was entered
    updated_at: datetime | None = None  # producer time of the last event


def apply(view: JobView | None, event: Event, seq: int) -> JobView:
    """Return the view after ``event`` (stream sequence ``seq``), or raise IllegalTransition."""
    transition = TRANSITIONS.get(event.type)
    if transition is None:
        raise IllegalTransition(f"{event.type} is not a job event")
    if view is None:
        if not isinstance(event, JobCreated):
            raise IllegalTransition(f"{event.type} for unknown job {event.aggregate_id}")
        if event.data.site != event.site:
            raise IllegalTransition(
                f"job.created names site {event.data.site!r} but was appended for {event.site!r}"
            )
        state = _created_state(event)
        return JobView(
            id=event.aggregate_id,
            site=event.site,
            state=state,
            last_seq=seq,
            # CREATED keeps its entry time when the job skips past it: latencies count from it.
            stage_times={JobState.CREATED.value: event.occurred_at, state.value: event.occurred_at},
            updated_at=event.occurred_at,
        )
    if event.aggregate_id != view.id or event.site != view.site:
        raise IllegalTransition(
            f"{event.type} for job {event.aggregate_id} at {event.site!r} does not match "
            f"job {view.id} at {view.site!r}"
        )
    if seq <= view.last_seq:
        raise IllegalTransition(f"sequence {seq} is not after {view.last_seq}")

    state = view.state
    lease_seq, lease_session = view.lease_seq, view.lease_session
    for skipped in skipped_steps(event):
        if skipped not in SKIPPABLE:
            raise IllegalTransition(f"{skipped} cannot be skipped")
        if skipped == "job.run_done":
            _check_run_carried(event)
        step = TRANSITIONS[skipped]
        state = _step(step, state, lease_seq is not None, skipped_in=event.type)
        if step.lease == "acquire":
            lease_seq, lease_session = seq, _session_of(event)
        elif step.lease == "end":
            lease_seq, lease_session = None, None

    state = _step(transition, state, lease_seq is not None)
    lease_seq, lease_session = _lease_after(transition, event, seq, lease_seq, lease_session)
    times = view.stage_times
    if state != view.state:  # lease events keep the state and must not move its entry time
        times = {**times, state.value: event.occurred_at}
    attempts = view.attempts + 1 if isinstance(event, JobStarted) else view.attempts
    # Built directly, not with dataclasses.replace: every consumer folds every job event
    # through here, and replace() introspects the fields each time.
    return JobView(
        id=view.id,
        site=view.site,
        state=state,
        last_seq=seq,
        lease_seq=lease_seq,
        lease_session=lease_session,
        attempts=attempts,
        stage_times=times,
        updated_at=event.occurred_at,
    )


def check_creation(event: JobCreated, owner: str | None) -> None:
    """Raise IllegalTransition unless ``event`` may create a job at a site owned by ``owner``.

    ``owner`` is the owner of the event's site as the consumer knows it (None: no such live
    site). The projector and the controller both call this, so no job runs that the read
    model refused to create.
    """
    if owner is None:
        raise IllegalTransition(f"job.created for unregistered site {event.site!r}")
    if event.actor != f"user:{owner}":
        raise IllegalTransition(f"job.created by {event.actor}, not site owner {owner}")


def fold(events: Iterable[tuple[int, Event]]) -> JobView | None:
    """Fold ``(sequence, event)`` pairs of one job, oldest first."""
    view: JobView | None = None
    for seq, event in events:
        view = apply(view, event, seq)
    return view


def steps_of(event_type: str, skipped: Sequence[str] = ()) -> tuple[str, ...]:
    """The transitions one event stands for, in the order the fold takes them.

    A ``job.created`` that skips steps skips the ones after it (it is created runnable); any
    other event's skipped steps come before it (``job.preprocessed`` skipping
    ``job.ready, job.staged_in``).
    """
    if event_type == "job.created":
        return (event_type, *skipped)
    return (*skipped, event_type)


def state_after(
    state: JobState | None, event_type: str, skipped: Sequence[str] = ()
) -> JobState | None:
    """The state a job is in after an event, by the table alone: the state :func:`apply`
    reaches, without its checks.

    For views that may not have seen a job's earlier events (a live view started late):
    ``state`` is what the view knows (None: nothing), and a lease event, which keeps the
    state, leaves it as it was. Events that are no job events leave it too. A view that
    folds every event of a job with this reaches the projector's state
    (tests/unit/test_state_rule.py).
    """
    for step in steps_of(event_type, skipped):
        transition = TRANSITIONS.get(step)
        if transition is not None and transition.target is not None:
            state = transition.target
    return state


def _created_state(event: JobCreated) -> JobState:
    """CREATED, or PREPROCESSED for a job created runnable; IllegalTransition if it may not be.

    Only what the event itself shows is judged: a job with parents must wait for them (the
    controller's step) and one with transfer items may stage in (the transfer module's).
    Whether its app has a ``preprocess`` hook is the api's call when it appends the event.
    """
    skipped = event.data.skipped
    if not skipped:
        return JobState.CREATED
    if skipped != CREATED_RUNNABLE:
        allowed, claimed = ", ".join(CREATED_RUNNABLE), ", ".join(skipped)
        raise IllegalTransition(f"job.created may skip {allowed} or nothing, not {claimed}")
    if event.data.parent_ids:
        raise IllegalTransition("job.created skips to runnable a job that has parents")
    if event.data.transfers:
        raise IllegalTransition("job.created skips to runnable a job that has transfer items")
    state = JobState.CREATED
    for step in steps_of(event.type, skipped)[1:]:
        state = _step(TRANSITIONS[step], state, leased=False, skipped_in=event.type)
    return state


def skipped_steps(event: Event) -> tuple[str, ...]:
    """The steps ``event`` records as skipped (empty for a payload without the field)."""
    data = event.data
    # Only payloads that have the field are asked: a pydantic model asked for a field it
    # lacks runs its __getattr__ and raises: microseconds, on every job event of every consumer.
    if "skipped" not in _fields(type(data)):
        return ()
    return tuple(data.skipped)  # type: ignore[attr-defined]


@functools.cache
def _fields(model: type[BaseModel]) -> frozenset[str]:
    return frozenset(model.model_fields)


def _check_run_carried(event: Event) -> None:
    # A run that is "skipped" without its result would lose the return code: only an event
    # that carries the result may stand for job.run_done.
    if event.type not in RUN_CARRIERS or getattr(event.data, "run", None) is None:
        raise IllegalTransition(f"{event.type} stands for job.run_done without the run's result")


def _session_of(event: Event) -> uuid.UUID | None:
    data = event.data
    if isinstance(data, LeaseData | StartedData):
        return data.session_id
    return None


def _step(
    transition: Transition, state: JobState, leased: bool, skipped_in: str | None = None
) -> JobState:
    where = f" (skipped inside {skipped_in})" if skipped_in else ""
    if state not in transition.sources:
        raise IllegalTransition(f"{transition.event} is not allowed from {state.value}{where}")
    if transition.lease == "acquire" and leased:
        raise IllegalTransition(f"{transition.event}: job is already leased{where}")
    if transition.lease in ("release", "require") and not leased:
        raise IllegalTransition(f"{transition.event}: job holds no lease{where}")
    return transition.target if transition.target is not None else state


def _lease_after(
    transition: Transition,
    event: Event,
    seq: int,
    lease_seq: int | None,
    lease_session: uuid.UUID | None,
) -> tuple[int | None, uuid.UUID | None]:
    match transition.lease:
        case "acquire":
            return seq, _session_of(event)
        case "release":
            _check_holder(event, lease_session)
            return None, None
        case "end":
            return None, None
        case "require":
            _check_holder(event, lease_session)
            return lease_seq, lease_session
        case _:
            return lease_seq, lease_session


def _check_holder(event: Event, lease_session: uuid.UUID | None) -> None:
    # Only the holder may act on (or release) its lease; anyone else's event is a forgery
    # or a zombie. An expiry names the session whose lease it ends, so it is checked too.
    session = _session_of(event)
    if session is not None and lease_session is not None and session != lease_session:
        raise IllegalTransition(
            f"{event.type} by session {session} but the lease is held by {lease_session}"
        )
