"""The one read a site key may make of the log: the newest event of one of its aggregates.

A direct get by subject (``$JS.API.DIRECT.GET.EVENTS.evt.<site>.>`` is all a site
may ask for), checked by the shared rule like every delivery. The pilot asks it to
learn what happened while it could not hear: whether the controller expired its
session, whether a job it runs was killed or fenced.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from lodestream.agents.launcher.work import trusted_event
from lodestream.schemas.envelope import Event
from lodestream.schemas.events import JobCreated
from lodestream.schemas.resources import JobSpec
from lodestream.schemas.subjects import EVENTS_STREAM, aggregate_filter, event_subject


@dataclass(frozen=True, slots=True)
class Newest:
    seq: int
    event: Event


async def newest_event(
    js: JetStreamContext, site: str, kind: str, aggregate_id: uuid.UUID
) -> Newest | None:
    """None if the aggregate has no event. Raises :class:`~agents.launcher.work.NotWork` if
    the rule refuses what is stored, and NATS's errors if it cannot be asked."""
    try:
        stored = await js.get_msg(
            EVENTS_STREAM, subject=aggregate_filter(site, kind, aggregate_id), direct=True
        )
    except NotFoundError:
        return None
    event = trusted_event(stored.subject or "", stored.data, site)
    return Newest(int(stored.seq or 0), event)


async def created_spec(js: JetStreamContext, site: str, job_id: uuid.UUID) -> JobSpec | None:
    """The spec the control plane created job ``job_id`` with, or None if it never did.

    ``job.created`` is a control-plane type: no site key can publish it, so its presence
    on the site's own subject is proof that a user submitted the job. Raises
    :class:`~agents.launcher.work.NotWork` if the rule refuses what is stored.
    """
    try:
        stored = await js.get_msg(
            EVENTS_STREAM, subject=event_subject(site, "job.created", job_id), direct=True
        )
    except NotFoundError:
        return None
    event = trusted_event(stored.subject or "", stored.data, site)
    return event.data if isinstance(event, JobCreated) else None
