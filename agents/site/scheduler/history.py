"""A batch job as the log has it, read with the only read a site key may make.

A site may direct-get the newest message of each of its own subjects, by subject. A batch
job's subjects are one per event type, so asking each gives the newest event of every type;
folded in sequence order they give the :class:`~lodestream.schemas.batch.BatchView` the
module acts on (what it submitted, what the scheduler was last seen to do, whether a deletion
was asked for, and the sequence to chain on). Each stored event is checked with the shared
rule, like a delivery: one the rule refuses is left out and logged.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from nats.js.errors import NotFoundError

from lodestream.schemas.batch import BATCH_TRANSITIONS, BatchView, fold_batch
from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import Untrusted
from lodestream.schemas.subjects import EVENTS_STREAM, event_subject
from lodestream.schemas.trust import check_own_site, event_from_message

log = logging.getLogger(__name__)


async def read_batch_job(js: Any, site: str, batch_id: uuid.UUID) -> BatchView | None:
    """The batch job's view from the log; None if it was never requested. NATS errors raise."""
    found = await asyncio.gather(*(
        _newest(js, event_subject(site, event_type, batch_id), site)
        for event_type in BATCH_TRANSITIONS
    ))  # fmt: skip
    return fold_batch(pair for pair in found if pair is not None)


async def _newest(js: Any, subject: str, site: str) -> tuple[int, Event] | None:
    try:
        stored = await js.get_msg(EVENTS_STREAM, subject=subject, direct=True)
    except NotFoundError:
        return None
    try:
        event = check_own_site(event_from_message(stored.subject or "", stored.data or b""), site)
    except Untrusted as exc:
        log.warning("scheduler: the log's newest %s is not to be trusted: %s", subject, exc)
        return None
    return int(stored.seq or 0), event
