"""The pilot batch-job lifecycle, as data, and the one way to ask for a pilot.

::

    requested ──submitted──▶ submitted ──queued/running──▶ queued ⇄ running ──finished──▶ finished
        │                        └──────────────────────────────────────────finished──▶
        ├──submit_failed──▶ submit_failed
        └──deletion_requested (from any state before the end) ──▶ deletion_requested
                                   └── submitted / queued / running keep it; finished ends it

:data:`BATCH_TRANSITIONS` maps each event type to the states it may follow and the state it
leads to. The projector folds batch jobs through it (an event it refuses is quarantined),
the API judges a deletion by it, and a test walks every pair. ``deletion_requested`` is
sticky: the scheduler may still report the job queued or running until the cancellation
takes, and a submission already under way may still be recorded (its scheduler id is what
the site cancels), but only ``batch.finished`` (or ``batch.submit_failed``) ends it.

:func:`request_batch_job` builds the ``batch.requested`` event for whoever asks — the API on
a user's behalf, or a site's elastic queue — so a request means the same from both.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Final

from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import IllegalTransition
from lodestream.schemas.events.batch import (
    BatchJobDeletionRequested,
    BatchJobFinished,
    BatchJobRequested,
    BatchJobSubmitted,
    BatchRequestData,
)
from lodestream.schemas.ids import uuid7
from lodestream.schemas.resources import BatchJobState

B = BatchJobState
FINAL_BATCH_STATES: Final = frozenset({B.FINISHED, B.SUBMIT_FAILED})
ACTIVE_BATCH_STATES: Final = frozenset(BatchJobState) - FINAL_BATCH_STATES
_LIVE: Final = (B.SUBMITTED, B.QUEUED, B.RUNNING)

Moves = Mapping[BatchJobState | None, BatchJobState]


def _moves(*pairs: tuple[Iterable[BatchJobState | None], BatchJobState]) -> Moves:
    return MappingProxyType({source: target for sources, target in pairs for source in sources})


BATCH_TRANSITIONS: Final[Mapping[str, Moves]] = MappingProxyType({
    "batch.requested": _moves(((None,), B.REQUESTED)),
    "batch.submitted": _moves(
        ((B.REQUESTED,), B.SUBMITTED), ((B.DELETION_REQUESTED,), B.DELETION_REQUESTED)
    ),
    "batch.submit_failed": _moves(((B.REQUESTED, B.DELETION_REQUESTED), B.SUBMIT_FAILED)),
    # A requeued job (node failure, preemption) goes from running back to queued.
    "batch.queued": _moves((_LIVE, B.QUEUED), ((B.DELETION_REQUESTED,), B.DELETION_REQUESTED)),
    "batch.running": _moves((_LIVE, B.RUNNING), ((B.DELETION_REQUESTED,), B.DELETION_REQUESTED)),
    "batch.finished": _moves(((*_LIVE, B.DELETION_REQUESTED), B.FINISHED)),
    # Asking twice (a user and the elastic queue) is no conflict.
    "batch.deletion_requested": _moves(
        ((B.REQUESTED, *_LIVE, B.DELETION_REQUESTED), B.DELETION_REQUESTED)
    ),
})  # fmt: skip
"""For each batch event type: the state it follows (None: none yet) → the state it leads to."""


def next_batch_state(state: BatchJobState | None, event_type: str) -> BatchJobState:
    """The state after ``event_type`` in ``state``; :class:`IllegalTransition` if not allowed."""
    moves = BATCH_TRANSITIONS.get(event_type)
    if moves is None:
        raise IllegalTransition(f"{event_type} is not a batch-job event")
    target = moves.get(state)
    if target is None:
        where = "a new batch job" if state is None else f"a {state.value} batch job"
        raise IllegalTransition(f"{event_type} is not allowed for {where}")
    return target


@dataclass(frozen=True, slots=True)
class BatchView:
    """What one batch job's events say: the fold a site agent acts on.

    ``observed`` is the last state the scheduler was seen in (submitted, queued or running),
    apart from ``state``, which a deletion request makes sticky; ``last_seq`` is the stream
    sequence of the aggregate's newest event, what the next append chains on.
    """

    id: uuid.UUID
    site: str
    request: BatchRequestData
    requested_id: uuid.UUID
    state: BatchJobState
    last_seq: int
    observed: BatchJobState = B.REQUESTED
    scheduler: str = ""
    scheduler_id: str | None = None
    deletion_id: uuid.UUID | None = None  # the deletion request's event id, if there is one
    reason: str = ""  # the scheduler's words with the last queued or running event (why it waits)

    @property
    def final(self) -> bool:
        return self.state in FINAL_BATCH_STATES


def fold_batch(events: Iterable[tuple[int, Event]]) -> BatchView | None:
    """Fold ``(stream sequence, event)`` pairs of one batch job, in sequence order.

    Events the lifecycle refuses are left out (the projector quarantines them); None if
    there is no ``batch.requested`` to start from.
    """
    view: BatchView | None = None
    for seq, event in sorted(events, key=lambda pair: pair[0]):
        view = apply_batch(view, seq, event)
    return view


def apply_batch(view: BatchView | None, seq: int, event: Event) -> BatchView | None:
    """``view`` after ``event`` at stream sequence ``seq``; unchanged if the lifecycle
    refuses the event or it is about another batch job."""
    if isinstance(event, BatchJobRequested):
        if view is not None:
            return view
        return BatchView(
            id=event.aggregate_id, site=event.site, request=event.data,
            requested_id=event.id, state=B.REQUESTED, last_seq=seq,
        )  # fmt: skip
    if view is None or event.aggregate_id != view.id:
        return view
    try:
        state = next_batch_state(view.state, event.type)
    except IllegalTransition:
        return view
    changes: dict[str, Any] = {"state": state, "last_seq": max(view.last_seq, seq)}
    match event:
        case BatchJobSubmitted(data=data):
            changes |= {"scheduler": data.scheduler, "scheduler_id": data.scheduler_id,
                        "observed": B.SUBMITTED}  # fmt: skip
        case BatchJobDeletionRequested():
            changes["deletion_id"] = event.id
        case BatchJobFinished():
            changes["observed"] = B.FINISHED
        case _ if event.type in {"batch.queued", "batch.running"}:
            changes["observed"] = B(event.type.partition(".")[2])
            changes["reason"] = str(getattr(event.data, "reason", ""))
    return replace(view, **changes)


def request_batch_job(
    site: str,
    data: BatchRequestData,
    *,
    actor: str,
    batch_id: uuid.UUID | None = None,
    event_id: uuid.UUID | None = None,
) -> BatchJobRequested:
    """The ``batch.requested`` event asking ``site`` for a pilot; append it with ``expect=0``.

    ``actor`` is ``user:<name>`` through the API or ``site:<site>`` for a site's own elastic
    queue; ``batch_id`` and ``event_id`` are fixed by a caller that retries (an idempotent
    request), new otherwise.
    """
    return BatchJobRequested.create(
        site=site,
        aggregate_id=batch_id or uuid7(),
        actor=actor,
        data=data,
        event_id=event_id,
    )


def batch_cause(
    batch_id: uuid.UUID, *, scheduler: str = "", scheduler_id: str | None = None, verdict: str
) -> str:
    """``batch job <id> (slurm 1234): walltime_expired``: the batch-job link of a job's cause
    chain (task → session → batch job → scheduler), as the pilot and the controller write it."""
    where = " ".join(w for w in (scheduler, scheduler_id or "") if w)
    return f"batch job {batch_id}" + (f" ({where})" if where else "") + f": {verdict}"
