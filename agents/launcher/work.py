"""Work items: a runnable event delivered on ``launch-<site>``, with what it takes to run it.

A delivery is work only if the shared rule (:mod:`lodestream.schemas.trust`) accepts it on
its subject, it is about this pilot's own site, and its type is one that makes a job
runnable (one that :data:`lodestream.schemas.topology.LAUNCH` carries). Anything else —
garbage, an event that names another site, a type that hands no work to pilots — is
:class:`NotWork`: the pilot terminates the delivery, logs it and counts it.

A ``job.created`` is on the feed for every job of the site, but is work only for a job
created runnable (:data:`lodestream.schemas.states.CREATED_RUNNABLE`): any other is
:class:`NotRunnable`, the controller's to move on, and the pilot acks it quietly. One created
runnable is checked by the fold as the projector checks it, so a pilot never runs a job that
the read model quarantined; and, being a control-plane type no site key can publish, it is
itself the proof that a user submitted the job (``WorkItem.submitted``).

A ``job.placement_refused`` (a pilot that can never run the job said so) carries the work
again, as a lease release does: the job stays runnable, and a pilot that fits leases it.

A ``job.restart_ready`` says when the retry is due (``retry_at``): until then
the item is not to be leased, and the pilot hands the delivery back to the
server with that delay (see ``Launcher._defer``).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import IllegalTransition, Untrusted
from lodestream.schemas.events.job import (
    JobCreated,
    JobPlacementRefused,
    LeaseData,
    RetryData,
    StepData,
)
from lodestream.schemas.fold import apply
from lodestream.schemas.resources import JobSpec
from lodestream.schemas.topology import LAUNCH
from lodestream.schemas.trust import check_own_site, event_from_message

log = logging.getLogger(__name__)

JobKey = tuple[str, uuid.UUID]
"""(site, job id): how a pilot keys what it holds, never by what a payload claims."""


@dataclass(frozen=True, slots=True)
class WorkItem:
    site: str
    job_id: uuid.UUID
    seq: int  # stream sequence of the runnable event: the lease chains on it
    spec: JobSpec
    attempt: int
    msg: Any  # the NATS message, acked or nak'ed by the launcher
    not_before: datetime | None = None  # a retry's due time: no lease before it
    # The delivery is the job's job.created: no need to read it back to know it was submitted.
    submitted: bool = False
    # The delivery is a pilot's job.placement_refused: a refusal is on record already.
    refused: bool = False

    @property
    def key(self) -> JobKey:
        return (self.site, self.job_id)

    def wait_s(self, now: datetime) -> float:
        """Seconds until the job may be leased; 0 when it may be now."""
        if self.not_before is None:
            return 0.0
        return max(0.0, (self.not_before - now).total_seconds())


class NotWork(ValueError):
    """A delivered message that carries no runnable job of this site; the message says why."""


class NotRunnable(NotWork):
    """A ``job.created`` of a job that is not created runnable: expected, and not a fault."""


def work_item(msg: Any, site: str) -> WorkItem:
    """The work ``msg`` hands to a pilot of ``site``; raise :class:`NotWork` if it is none."""
    event = trusted_event(msg.subject, msg.data, site)
    if not LAUNCH.carries(event.type):
        raise NotWork(f"{event.type} makes no job runnable")
    seq = int(msg.metadata.sequence.stream)
    if isinstance(event, JobCreated):
        return _created_item(event, seq, msg)
    data = event.data
    if not isinstance(data, StepData | LeaseData | RetryData) or data.work is None:
        raise NotWork(f"{event.type} for {event.aggregate_id} carries no work")
    return WorkItem(
        site=event.site,
        job_id=event.aggregate_id,
        seq=seq,
        spec=data.work,
        attempt=data.attempt,
        msg=msg,
        not_before=data.retry_at if isinstance(data, RetryData) else None,
        refused=isinstance(event, JobPlacementRefused),
    )


def _created_item(event: JobCreated, seq: int, msg: Any) -> WorkItem:
    if not event.runnable:
        raise NotRunnable(f"job {event.aggregate_id} is not created runnable")
    try:
        apply(None, event, seq)  # what the projector would quarantine is not run either
    except IllegalTransition as exc:
        raise NotWork(f"job.created for {event.aggregate_id}: {exc}") from exc
    return WorkItem(
        site=event.site, job_id=event.aggregate_id, seq=seq, spec=event.data, attempt=1,
        msg=msg, submitted=True,
    )  # fmt: skip


def trusted_event(subject: str, data: bytes | None, site: str) -> Event:
    """The event received on ``subject`` if the shared rule holds for it at ``site``; else
    :class:`NotWork`."""
    try:
        return check_own_site(event_from_message(subject, data or b""), site)
    except Untrusted as exc:
        raise NotWork(str(exc)) from exc
