"""A launcher's session: opened once, kept alive by heartbeats that the server expires itself.

Heartbeats go to ``hb.<site>.<session>`` with no per-message TTL (the ``HBIN``
stream refuses TTL and rollup headers from sites); ``HB`` sources them and
removes each one ``NatsSettings.heartbeat_ttl_s`` after it was written (a
stream-level max age), leaving a delete marker. If this process stops (killed,
paused, cut off), that marker is how the controller learns it, and it fences
every job of the session and appends ``session.expired``. The pilot beats every
third of the TTL, and at once after a reconnect: an outage shorter than about two
thirds of the TTL (the TTL less one beat interval and the reconnect) expires nothing.

A failed or slow publish proves nothing about the session. A heartbeat that was
not acknowledged for longer than the TTL (``lapsed``) only puts the session *in
doubt*: from then on, every beat first asks the log whether the controller
appended ``session.expired`` (a direct get of the session's newest event, by
subject). The session is ``lost`` only once it did: the server expired it, and
every append chained on its leases is refused.

The pilot beats while it retries ``session.opened`` too (``Launcher._open``): the
pauses between tries grow past the TTL during a leader election, and the controller
expires a heartbeat that stops even before the session is opened. If it did anyway
(heartbeats refused as well), the open is refused (:class:`ExpiredBeforeOpened`) and
the pilot renews the session under a new id (:meth:`LauncherSession.renew`): it held
nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import orjson
from nats.js import JetStreamContext

from lodestream.agents.launcher.decide import beat_interval_s
from lodestream.agents.launcher.errors import ExpiredBeforeOpened
from lodestream.agents.launcher.reads import newest_event
from lodestream.agents.launcher.work import NotWork
from lodestream.eventlog import ConflictError, EventLog
from lodestream.schemas.events import Heartbeat, SessionClosed, SessionOpened
from lodestream.schemas.events.session import SessionClosedData, SessionOpenedData
from lodestream.schemas.ids import uuid7
from lodestream.schemas.resources import NodeInfo
from lodestream.schemas.subjects import heartbeat_subject

log = logging.getLogger(__name__)


class LauncherSession:
    def __init__(
        self,
        js: JetStreamContext,
        site: str,
        *,
        heartbeat_ttl_s: int,
        wall_time_min: float,
        batch_job_id: uuid.UUID | None = None,
    ) -> None:
        self.id = uuid7()
        self.batch_job_id = batch_job_id  # recorded in session.opened
        self.site = site
        self.ttl_s = heartbeat_ttl_s
        self.deadline = time.monotonic() + wall_time_min * 60
        self._js = js
        self._log = EventLog(js)
        self._last_ok = time.monotonic()
        self._in_doubt = False
        self._lost = False
        self._seq = 0
        self._wake = asyncio.Event()
        # The sources this pilot's node caches hold, for its peers (set by the pilot).
        self.cached: Callable[[], tuple[str, ...]] = tuple

    @property
    def actor(self) -> str:
        return f"launcher:{self.id}"

    @property
    def lapsed(self) -> bool:
        """No heartbeat acknowledged for longer than the TTL: the server may have expired us."""
        return time.monotonic() - self._last_ok > self.ttl_s

    @property
    def lost(self) -> bool:
        """The controller expired this session; it never becomes False again (we were fenced)."""
        return self._lost

    def remaining_min(self) -> float:
        return (self.deadline - time.monotonic()) / 60

    def suspect(self) -> None:
        """Something hints we were fenced (a refused append, a reconnect): check at once."""
        self._in_doubt = True
        self._wake.set()

    def wake(self) -> None:
        """Beat now (NATS is back: the server's timer ran on while we could not beat)."""
        self._wake.set()

    async def open(self, hostname: str, mode: str, nodes: list[NodeInfo]) -> None:
        """Open the session; safe to call again after a failure (the event id is fixed)."""
        deadline = datetime.now(UTC) + timedelta(minutes=self.remaining_min())
        opened = SessionOpened.create(
            site=self.site, aggregate_id=self.id, actor=self.actor,
            data=SessionOpenedData(hostname=hostname, mode=mode, nodes=tuple(nodes),
                                   deadline=deadline, heartbeat_ttl_s=self.ttl_s,
                                   batch_job_id=self.batch_job_id),
            event_id=uuid.uuid5(self.id, "opened"),
        )  # fmt: skip
        if self._lost:  # heartbeat_forever saw the controller's session.expired on the log
            raise ExpiredBeforeOpened(self.id)
        # Heartbeat first: a session that leases work must already be expirable.
        await self.beat(0, 0, 0)
        try:
            self._seq = (await self._log.append(opened, expect=0)).seq
        except ConflictError as exc:
            # EventLog already took an earlier try of ours that landed for success (same
            # event id on the subject). What else can precede our first event: the
            # controller's session.expired, appended without CAS when a heartbeat of ours
            # expired while the open was being retried. Then this id is spent for good.
            if await self._expired_by_controller():
                raise ExpiredBeforeOpened(self.id) from exc
            raise

    def renew(self) -> None:
        """Become a new session, after this one was expired before it was opened.

        Safe only then: an unopened session leased nothing, so nothing is fenced or lost;
        the new id gets its own heartbeat, ``session.opened`` and leases.
        """
        if self._seq:
            raise RuntimeError(f"session {self.id} is open: it cannot be renewed")
        self.id = uuid7()
        self._last_ok = time.monotonic()
        self._in_doubt = False
        self._lost = False

    async def beat(self, running: int, leased: int, free_cores: int) -> None:
        if self._lost:
            return  # beating again would make a fenced session look alive
        body = Heartbeat(
            session_id=self.id, site=self.site, at=datetime.now(UTC),
            running=running, leased=leased, free_cores=free_cores, cached=self.cached(),
        )  # fmt: skip
        await self._js.publish(
            heartbeat_subject(self.site, self.id), orjson.dumps(body.model_dump(mode="json"))
        )
        self._last_ok = time.monotonic()

    async def heartbeat_forever(
        self, stats: Callable[[], tuple[int, int, int]], stop: asyncio.Event
    ) -> None:
        interval = beat_interval_s(self.ttl_s)
        while not stop.is_set() and not self._lost:
            self._wake.clear()
            try:
                await self._beat_unless_expired(stats)
            except Exception as exc:  # NATS down or slow: only the log's verdict counts
                log.warning("session %s: heartbeat failed: %s", self.id, exc or type(exc).__name__)
            if self._lost:
                break
            await _first_of(stop, self._wake, interval)

    async def _beat_unless_expired(self, stats: Callable[[], tuple[int, int, int]]) -> None:
        if self.lapsed and not self._in_doubt:
            log.warning("session %s: no heartbeat acknowledged for %d s; checking whether "
                        "it expired", self.id, self.ttl_s)  # fmt: skip
            self._in_doubt = True
        # Ask before beating: a beat would recreate the heartbeat of an expired session.
        if self._in_doubt and await self._expired_by_controller():
            self._lost = True
            log.error("session %s: expired by the controller; its jobs are fenced", self.id)
            return
        await self.beat(*stats())

    async def _expired_by_controller(self) -> bool:
        """Whether the session's newest event on the log is the controller's session.expired."""
        try:
            newest = await newest_event(self._js, self.site, "session", self.id)
        except NotWork as exc:
            log.warning("session %s: newest event refused: %s", self.id, exc)
            return False
        return newest is not None and newest.event.type == "session.expired"

    async def close(self, reason: str) -> None:
        closed = SessionClosed.create(
            site=self.site, aggregate_id=self.id, actor=self.actor,
            data=SessionClosedData(reason=reason), event_id=uuid.uuid5(self.id, "closed"),
        )  # fmt: skip
        try:
            await self._log.append(closed, expect=self._seq)
        except Exception as exc:
            log.warning("session %s: could not close: %s", self.id, exc)


async def _first_of(stop: asyncio.Event, wake: asyncio.Event, seconds: float) -> None:
    """Wait until ``stop`` or ``wake`` is set, or ``seconds`` pass."""
    waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
