"""One client's push feed: SSE frames from the hub of its filter, or from its own consumer.

A client near the live edge is fed by the :class:`~lodestream.services.api.feedhub.FeedHub`
of its filter, which reads JetStream once for all such clients and keeps a shared history
that each takes from at its own pace. A client further back than a hub's history (it
resumed with ``Last-Event-ID`` or ``since``, or fell behind) reads through a consumer of
its own — a *pull* consumer without acks, asked for no more than its outbox has room for,
so whatever the client's speed (and however far back it starts: ``since=0`` replays the
log a page at a time) the api holds at most ``queue_size`` events and ``queue_bytes``
bytes for it and nats-server holds the rest where it already is, in the stream — and
joins its filter's hub as soon as the hub's history reaches back to it (starting one when
it has caught up with the log and its filter has none). A client whose outbox stays full
for ``lag_s``, or whose socket takes nothing for ``lag_s``
(:class:`~lodestream.services.api.feedresponse.FeedResponse`), is told so (``event:
lagged`` with the last sequence it was sent) and disconnected; it resumes with
``Last-Event-ID`` (a browser's EventSource does that by itself). Consumers are deleted
when their last reader goes; ``inactive_threshold`` removes them should the api die first.

Every event passes :func:`lodestream.schemas.trust.event_from_message` (in
:class:`~lodestream.services.api.feedframes.FrameCache`) before the caller's filter: what
a site wrote is hostile until checked, here as in every other consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator

from nats.js import JetStreamContext

from lodestream.eventlog.pull import PullConsumer, fetch_or_pause
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.services.api.feedbox import Outbox
from lodestream.services.api.feedfilter import FeedFilter
from lodestream.services.api.feedframes import (
    OPENING,
    accepted_frames,
    heartbeat_frame,
    interrupted_frame,
    lagged_frame,
)
from lodestream.services.api.feedhub import (
    CLOSE_TIMEOUT_S,
    MAX_FETCH,
    FeedHub,
    FeedHubs,
    consumer_config,
    release_consumer,
)
from lodestream.settings import StreamSettings

log = logging.getLogger(__name__)


class LiveFeed:
    """Open with :meth:`open`, iterate :meth:`frames`, always :meth:`close`."""

    def __init__(
        self,
        js: JetStreamContext,
        chosen: FeedFilter,
        after_seq: int,
        settings: StreamSettings,
        hubs: FeedHubs,
    ) -> None:
        self.outbox = Outbox(settings.queue_size, settings.queue_bytes)
        self.position = after_seq  # the newest sequence it was given, or skipped past
        self.cursor = 0  # in its hub's history, while a hub feeds it
        self._js = js
        self._filter = chosen
        self._settings = settings
        self._hubs = hubs
        self._sent_seq = after_seq  # the newest id the client has taken
        self._hub: FeedHub | None = None
        self._own: asyncio.Task[None] | None = None  # the pump of a consumer of its own
        self._lagged = False
        self._interrupted = False
        self._closed = False

    async def open(self, log_end: int) -> None:
        """Start feeding: from its filter's hub if that holds what it needs (or if it starts
        at the end of the log), else from a consumer of its own."""
        if not await self._join_hub(start=self.position >= log_end):
            self._start_own()

    async def close(self) -> None:
        """Release everything the client held; safe to call twice, and while cancelled."""
        self._closed = True
        hub, self._hub = self._hub, None
        pump = hub.leave(self) if hub is not None else None
        if pump is not None:  # it was the hub's last client: its consumer goes too
            await asyncio.wait([pump], timeout=2 * CLOSE_TIMEOUT_S)
        own, self._own = self._own, None
        if own is not None:
            own.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await own

    def leave_hub(self) -> None:
        # Called by the hub: the client fell behind it, or it stopped. Its own consumer
        # takes over from where it got to.
        self._hub = None
        if not self._closed:
            self._start_own()

    def lagged(self) -> bytes:
        """The client did not take what it was sent: the last frame to send it."""
        self._lagged = True
        return lagged_frame(self._sent_seq)

    async def frames(self) -> AsyncGenerator[bytes, None]:
        """SSE frames until the client lags (then a last ``lagged`` frame) or the feed ends.

        Each is asked for once the one before was written: a frame whose write never ends
        never counts as sent."""
        yield OPENING
        while True:
            if self._lagged:
                yield lagged_frame(self._sent_seq)
                return
            if self._interrupted and self.outbox.empty():
                yield interrupted_frame(self._sent_seq)
                return
            # Whatever is there goes in one write: one send per batch, not per event, is
            # what lets one api serve many clients of a busy log.
            hub = self._hub
            if hub is not None and self.outbox.empty():
                taken = await hub.read(self)
                if taken is None:
                    continue  # handed back to a consumer of its own
                chunk, newest = taken
            else:
                chunk, newest = await self.outbox.take()
            if chunk:
                yield chunk
            if newest:
                self._sent_seq = newest

    async def _join_hub(self, *, start: bool) -> bool:
        hub = await self._hubs.join(self._js, self, self._filter, self._settings, start=start)
        self._hub = hub
        return hub is not None

    def _start_own(self) -> None:
        self._own = asyncio.create_task(self._run_own(), name="feed-own")

    async def _run_own(self) -> None:
        name: str | None = None
        sub: PullConsumer | None = None
        try:
            config = consumer_config(self._filter, self.position, self._settings)
            name = (await self._js.add_consumer(EVENTS_STREAM, config)).name
            sub = await PullConsumer.on(self._js, EVENTS_STREAM, name).start()
            while not self._lagged:
                if self.outbox.room <= 0:
                    await self._wait_for_room()
                    continue
                caught_up = await self._fill(sub)
                if await self._join_hub(start=caught_up):
                    self.outbox.wake()  # frames() reads the hub once the outbox is sent
                    return  # the hub of its filter feeds it from here
        except asyncio.CancelledError:
            raise
        except Exception:
            # NATS gone for good or the consumer removed: end the stream; the client resumes.
            log.exception("push feed %s stopped", name)
            self._interrupted = True
            self.outbox.wake()
        finally:
            await release_consumer(self._js, sub, name)

    async def _wait_for_room(self) -> None:
        self.outbox.taken.clear()
        try:
            async with asyncio.timeout(self._settings.lag_s):
                await self.outbox.taken.wait()
        except TimeoutError:
            # frames() is blocked sending, not waiting on the outbox: it sees the flag as
            # soon as the client takes what is in flight.
            self._lagged = True
            self.outbox.wake()

    async def _fill(self, sub: PullConsumer) -> bool:
        """Read what fits; True when it has read everything there is (caught up)."""
        want = min(self.outbox.room, MAX_FETCH)
        try:
            msgs = await fetch_or_pause(sub, want, timeout=self._settings.heartbeat_s)
        except TimeoutError:
            msgs = []
        framed, seen = accepted_frames(self._hubs.cache, self._filter, msgs)
        if seen is not None:
            self.position = seen
        if framed:
            self.outbox.put(b"".join(f for _, f in framed), len(framed), framed[-1][0])
        elif self.outbox.empty():
            self.outbox.put(heartbeat_frame(self.position), 1, self.position)
        return not msgs or msgs[-1].metadata.num_pending == 0
