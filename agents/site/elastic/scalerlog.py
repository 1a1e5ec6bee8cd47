"""What the elastic queue reads and writes on the log, with a site key's rights only.

A site reads no stream and no table: it direct-gets the newest event of one of its own
subjects (``$JS.API.DIRECT.GET.EVENTS.evt.<site>.>``), and checks it with the shared rule like
every delivery. The newest ``scaler.backlog`` is what the control plane last said about the
site's backlog; the newest ``scaler.decided`` is the site's own last decision.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Generic, TypeVar

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from lodestream.eventlog import Appended, EventLog
from lodestream.eventlog.append import H_MSG_ID
from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import Untrusted
from lodestream.schemas.events.scaler import ScalerBacklog, ScalerDecided, scaler_id
from lodestream.schemas.subjects import EVENTS_STREAM, event_subject
from lodestream.schemas.trust import check_own_site, event_from_message

log = logging.getLogger(__name__)
E = TypeVar("E", bound=Event)


@dataclass(frozen=True, slots=True)
class Stored(Generic[E]):
    """The newest message on a subject: its sequence, and the event if the rule accepts it."""

    seq: int
    event: E | None


class ScalerLog:
    def __init__(self, js: JetStreamContext, site: str) -> None:
        self._js = js
        self._site = site
        self._log = EventLog(js)
        self.refused = 0  # stored events the shared rule refused

    async def backlog(self) -> Stored[ScalerBacklog] | None:
        return await self._newest(ScalerBacklog)

    async def decision(self) -> Stored[ScalerDecided] | None:
        return await self._newest(ScalerDecided)

    async def append(self, event: Event, *, expect: int | None) -> Appended:
        return await self._log.append(event, expect=expect)

    async def ensure(self, event: Event, *, expect: int | None) -> int:
        """Append ``event`` unless its subject's newest message is it; return its sequence.

        A retried append inside the duplicate window is free anyway; this also holds after it,
        so completing an old decision never doubles what it caused.
        """
        try:
            stored = await self._js.get_msg(EVENTS_STREAM, subject=event.subject, direct=True)
        except NotFoundError:
            stored = None
        if stored is not None and (stored.headers or {}).get(H_MSG_ID) == str(event.id):
            return int(stored.seq or 0)
        return (await self._log.append(event, expect=expect)).seq

    async def _newest(self, cls: type[E]) -> Stored[E] | None:
        subject = event_subject(self._site, cls.event_type, scaler_id(self._site))  # type: ignore[attr-defined]
        try:
            stored = await self._js.get_msg(EVENTS_STREAM, subject=subject, direct=True)
        except NotFoundError:
            return None
        seq = int(stored.seq or 0)
        try:
            event = check_own_site(event_from_message(subject, stored.data or b""), self._site)
        except Untrusted as exc:
            self.refused += 1
            log.warning("elastic queue: refused seq %d on %s: %s", seq, subject, exc)
            return Stored(seq, None)
        return Stored(seq, event if isinstance(event, cls) else None)
