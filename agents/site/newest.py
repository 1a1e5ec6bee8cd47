"""The newest event of one of the site's own subjects: the one read a site key may make.

A site may direct-get the newest message of each of its own subjects. The scheduler and
transfer modules fold an aggregate from the newest event of each of its types; each stored
event is checked with the shared rule like a delivery, and one the rule refuses is left out
and logged.
"""

from __future__ import annotations

import logging
from typing import Any

from nats.js.errors import NotFoundError

from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import Untrusted
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.schemas.trust import check_own_site, event_from_message

log = logging.getLogger(__name__)


async def newest_event(js: Any, subject: str, site: str) -> tuple[int, Event] | None:
    """``(stream sequence, event)`` of the newest message on ``subject``; None if there is
    none or it is not to be trusted. NATS errors raise."""
    try:
        stored = await js.get_msg(EVENTS_STREAM, subject=subject, direct=True)
    except NotFoundError:
        return None
    try:
        event = check_own_site(event_from_message(stored.subject or "", stored.data or b""), site)
    except Untrusted as exc:
        log.warning("the log's newest %s is not to be trusted: %s", subject, exc)
        return None
    return int(stored.seq or 0), event
