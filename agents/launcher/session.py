"""A launcher's session: opened once, kept alive by heartbeats the server expires on its own.

The heartbeat carries a per-message TTL; if this process stops (killed,
paused, cut off), NATS deletes the heartbeat when the TTL runs out and the
controller fences every job of the session. ``lost`` is how the launcher
learns, after a pause, that this already happened: no heartbeat has been
acknowledged for longer than the TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import orjson
from nats.js import JetStreamContext

from lodestream.eventlog import EventLog
from schemas.events import Heartbeat, SessionClosed, SessionOpened
from schemas.events.session import SessionClosedData, SessionOpenedData
from schemas.ids import uuid7
from schemas.resources import NodeInfo
from schemas.subjects import heartbeat_subject

log = logging.getLogger(__name__)


class LauncherSession:
    def __init__(
        self, js: JetStreamContext, site: str, *, heartbeat_ttl_s: int, wall_time_min: float
    ) -> None:
        self.id = uuid7()
        self.site = site
        self.ttl_s = heartbeat_ttl_s
        self.deadline = time.monotonic() + wall_time_min * 60
        self._js = js
        self._log = EventLog(js)
        self._last_ok = time.monotonic()
        self._expired = False
        self._seq = 0

    @property
    def actor(self) -> str:
        return f"launcher:{self.id}"

    @property
    def lost(self) -> bool:
        """True once the heartbeat lapsed; it never becomes False again (we were fenced)."""
        if not self._expired and time.monotonic() - self._last_ok > self.ttl_s:
            self._expired = True
        return self._expired

    def remaining_min(self) -> float:
        return (self.deadline - time.monotonic()) / 60

    async def open(self, hostname: str, mode: str, nodes: list[NodeInfo]) -> None:
        deadline = datetime.now(UTC) + timedelta(minutes=self.remaining_min())
        opened = SessionOpened.create(
            site=self.site, aggregate_id=self.id, actor=self.actor,
            data=SessionOpenedData(hostname=hostname, mode=mode, nodes=tuple(nodes),
                                   deadline=deadline, heartbeat_ttl_s=self.ttl_s),
        )  # fmt: skip
        # Heartbeat first: a session that leases work must already be expirable.
        await self.beat(0, 0, 0)
        self._seq = (await self._log.append(opened, expect=0)).seq

    async def beat(self, running: int, leased: int, free_cores: int) -> None:
        if self.lost:
            return  # beating again would make a fenced session look alive
        body = Heartbeat(
            session_id=self.id, site=self.site, at=datetime.now(UTC),
            running=running, leased=leased, free_cores=free_cores,
        )  # fmt: skip
        await self._js.publish(
            heartbeat_subject(self.site, self.id),
            orjson.dumps(body.model_dump(mode="json")),
        )
        self._last_ok = time.monotonic()

    async def heartbeat_forever(
        self, stats: Callable[[], tuple[int, int, int]], stop: asyncio.Event
    ) -> None:
        interval = max(self.ttl_s / 3, 0.5)
        while not stop.is_set():
            try:
                await self.beat(*stats())
            except Exception as exc:
                log.warning("session %s: heartbeat failed: %s", self.id, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    async def close(self, reason: str) -> None:
        closed = SessionClosed.create(
            site=self.site, aggregate_id=self.id, actor=self.actor,
            data=SessionClosedData(reason=reason), event_id=uuid.uuid5(self.id, "closed"),
        )  # fmt: skip
        try:
            await self._log.append(closed, expect=self._seq)
        except Exception as exc:
            log.warning("session %s: could not close: %s", self.id, exc)
