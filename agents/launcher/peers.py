"""What the site's other pilots cache, as their heartbeats say (the ``PEERS`` feed).

Every pilot's heartbeat names the sources its node caches hold (``Heartbeat.cached``); a
pilot hears its site's heartbeats live (``hb.<site>.*``) and keeps the latest of each peer.
A peer not heard for a heartbeat TTL is taken as gone, as the server's own timer would.
What a heartbeat claims only makes a pilot hand a delivery back a bounded number of times
(:func:`lodestream.agents.launcher.decide.cache_deferral`), so a wrong or forged one costs
a little latency, never a job.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from lodestream.agents.launcher import decide
from lodestream.schemas.errors import Untrusted
from lodestream.schemas.trust import HeartbeatBeat, heartbeat_message

log = logging.getLogger(__name__)


class PeerCaches:
    def __init__(
        self,
        site: str,
        own: Callable[[], uuid.UUID],
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._site = site
        # Asked at each heartbeat, not kept: a session expired before it opened is renewed
        # under a new id (LauncherSession.renew), whose beats are ours too.
        self._own = own
        self._ttl_s = ttl_s
        self._clock = clock
        self._peers: dict[uuid.UUID, tuple[float, frozenset[str]]] = {}
        self.refused = 0  # heartbeats that failed the shared rule

    def heard(self, subject: str, headers: dict[str, str] | None, data: bytes) -> None:
        try:
            message = heartbeat_message(subject, headers, data)
        except Untrusted as exc:
            self.refused += 1
            log.debug("launcher: heartbeat on %s ignored: %s", subject, exc)
            return
        if message.site != self._site or message.session_id == self._own():
            return
        if not isinstance(message, HeartbeatBeat):  # the server expired that session
            self._peers.pop(message.session_id, None)
            return
        self._peers[message.session_id] = (self._clock(), frozenset(message.heartbeat.cached))

    async def on_message(self, msg: Any) -> None:
        """The ``PEERS`` subscription's callback."""
        self.heard(msg.subject, msg.headers, msg.data or b"")

    @property
    def advert_interval_s(self) -> float:
        """How often a peer says what it caches: a deferral shorter than this is wasted."""
        return decide.beat_interval_s(self._ttl_s)

    def best(self, wanted: frozenset[str]) -> int:
        """How many of ``wanted`` the live peer holding most of them holds."""
        now = self._clock()
        for session, (at, _) in list(self._peers.items()):
            if now - at > self._ttl_s:
                del self._peers[session]
        return max((len(wanted & cached) for _, cached in self._peers.values()), default=0)
