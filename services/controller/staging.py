"""The controller's part in data staging: request a step's transfer items, end the step.

A job with files to stage in reaches READY (``job.ready``, or ``job.reset`` after a failure);
one with files to stage out reaches POSTPROCESSED. The event that put it there begins the
*step*: the controller requests one ``xfer.requested`` item per slot of that direction, with
ids derived from the event (:func:`lodestream.schemas.xfer.item_id`), so deciding again
requests the same items and a job staged again after a reset gets new ones. The site's
transfer module moves them. When an item of the step settles, the controller reads the
step's items (the projector has folded them: it acts on site-written events only once it
has) and, if every one succeeded, moves the job on (``job.staged_in`` / ``job.staged_out``);
if one failed, it fails the job with the item's reason. Both chain on the job's last event
and take their ids from the step, so whichever item's event comes last decides, once.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from lodestream.eventlog.kernel import Append
from lodestream.schemas.envelope import Event
from lodestream.schemas.events import JobFailed, JobStagedIn, JobStagedOut, TransferRequested
from lodestream.schemas.events.job import FailureData, StepData
from lodestream.schemas.events.xfer import TransferRequestedData
from lodestream.schemas.ids import derived_id
from lodestream.schemas.resources import App, JobSpec, TransferState
from lodestream.schemas.states import JobState
from lodestream.schemas.xfer import Direction, item_id, local_path
from lodestream.services.controller.decide import ACTOR

# The job state each direction's step runs in: a settled item of a job no longer there (killed,
# reset) decides nothing.
STEP_STATE = {"in": JobState.READY, "out": JobState.POSTPROCESSED}


@dataclass(frozen=True, slots=True)
class StepItem:
    """One transfer item of a step, as the read model shows it."""

    slot: str
    state: TransferState
    reason: str = ""


@dataclass(frozen=True, slots=True)
class StepView:
    """A staging step: the job it moves and every item requested for it."""

    job_id: uuid.UUID
    site: str
    step_id: uuid.UUID
    direction: Direction
    job_state: JobState
    job_seq: int
    items: Sequence[StepItem]


def request_items(
    cause: Event, job_id: uuid.UUID, spec: JobSpec, app: App | None, direction: Direction
) -> list[Append]:
    """``xfer.requested`` for each of the job's slots in ``direction``; ``cause`` begins the step.

    A slot the app does not define is not staged (the api refuses such jobs; an app changed
    since is the site's to answer for): the same rule as ``App.steps``.
    """
    if app is None:
        return []
    appends = []
    for slot, remote in sorted(spec.transfers.items()):
        defined = app.transfers.get(slot)
        if defined is None or defined.direction != direction:
            continue
        item = item_id(cause.id, job_id, slot, direction)
        event = TransferRequested.create(
            site=spec.site, aggregate_id=item, actor=ACTOR,
            data=TransferRequestedData(
                job_id=job_id, slot=slot, direction=direction, remote=remote,
                local_path=local_path(spec.workdir, defined.local_path), step_id=cause.id,
                cache=defined.cache and direction == "in" and not remote.recursive,
                overwrite=remote.overwrite or defined.overwrite, verify=defined.verify,
            ),
            event_id=derived_id(str(cause.id), "controller", "xfer.requested", str(item)),
            causation_id=cause.id,
        )  # fmt: skip
        # A new aggregate: nothing may be on its subjects yet.
        appends.append(Append(event, 0))
    return appends


def settle_step(cause: Event, step: StepView, spec: JobSpec) -> list[Append]:
    """An item of ``step`` settled (``cause``): end the step if it is over."""
    if step.job_state != STEP_STATE[step.direction] or not step.items:
        return []
    failed = [item for item in step.items if item.state == TransferState.FAILED]
    word = "stage-in" if step.direction == "in" else "stage-out"
    event: Event
    if failed:
        first = sorted(failed, key=lambda item: item.slot)[0]
        event = JobFailed.create(
            site=step.site, aggregate_id=step.job_id, actor=ACTOR,
            data=FailureData(
                reason=f"{word} of slot {first.slot!r} failed: {first.reason}",
                cause=tuple(f"transfer {item.slot}: {item.reason}" for item in failed),
            ),
            event_id=_id(step, "job.failed"), causation_id=cause.id,
        )  # fmt: skip
    elif all(item.state == TransferState.SUCCEEDED for item in step.items):
        moved = JobStagedIn if step.direction == "in" else JobStagedOut
        note = f"{len(step.items)} item(s) {'staged in' if step.direction == 'in' else 'out'}"
        event = moved.create(
            site=step.site, aggregate_id=step.job_id, actor=ACTOR,
            data=StepData(note=note, work=spec),
            event_id=_id(step, moved.event_type), causation_id=cause.id,
        )  # fmt: skip
    else:
        return []
    return [Append(event, step.job_seq)]


def _id(step: StepView, kind: str) -> uuid.UUID:
    return derived_id(str(step.step_id), "controller", kind, str(step.job_id))
