"""One client's push feed: an ephemeral JetStream consumer, a bounded queue, SSE frames.

Each client of ``/events/stream`` gets its own consumer on the api's control-plane
connection, filtered to the caller's sites (and kinds and types), starting after the
sequence it resumes from. It is a *pull* consumer without acks: the pump asks for no more
than the queue has room for, so whatever the client's speed, the api holds at most
``queue_size`` events for it and nats-server holds the rest where it already is, in the
stream. A client that leaves the queue full for ``lag_s`` is told so (``event: lagged``
with the last sequence it was sent) and disconnected; it resumes with ``Last-Event-ID``
(a browser's EventSource does that by itself). The consumer is deleted when the client
goes; ``inactive_threshold`` removes it should the api die first.

Every event passes :func:`lodestream.schemas.trust.event_from_message` before the caller's
filter: what a site wrote is hostile until checked, here as in every other consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Final

import nats.errors
import orjson
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from lodestream.eventlog.pull import PullConsumer
from lodestream.schemas.codec import to_document
from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import Untrusted
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.schemas.trust import event_from_message
from lodestream.services.api.feedfilter import FeedFilter
from lodestream.settings import StreamSettings

log = logging.getLogger(__name__)

RETRY_MS: Final = 1000  # how soon a browser reconnects after a lag or a restart
MAX_FETCH: Final = 256
CLOSE_TIMEOUT_S: Final = 2.0
FRAME_CACHE_SIZE: Final = 8192
MAX_WRITE: Final = 256  # frames per write to the client


class FrameCache:
    """The checked event and its SSE frame by stream sequence, shared by every client.

    Clients of a busy dashboard read the same events at about the same time: each is
    decoded, checked and serialised once, not once per client. One per app (its stream).
    """

    def __init__(self, size: int = FRAME_CACHE_SIZE) -> None:
        self._size = size
        self._frames: OrderedDict[int, tuple[Event, bytes] | None] = OrderedDict()

    def get(self, seq: int, subject: str, data: bytes) -> tuple[Event, bytes] | None:
        if seq in self._frames:
            return self._frames[seq]
        try:
            event = event_from_message(subject, data)
        except Untrusted as exc:
            log.warning("push feed: refused %s (seq %d): %s", subject, seq, exc)
            found = None
        else:
            found = (event, event_frame(seq, {"seq": seq, **to_document(event)}))
        self._frames[seq] = found
        if len(self._frames) > self._size:
            self._frames.popitem(last=False)
        return found


class LiveFeed:
    """Open with :meth:`open`, iterate :meth:`frames`, always :meth:`close`."""

    def __init__(
        self,
        js: JetStreamContext,
        chosen: FeedFilter,
        after_seq: int,
        settings: StreamSettings,
        cache: FrameCache,
    ) -> None:
        self._js = js
        self._cache = cache
        self._filter = chosen
        self._settings = settings
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(settings.queue_size)
        self._taken = asyncio.Event()
        self._lagged = False
        self._interrupted = False
        self._sent_seq = after_seq  # the newest sequence the client was sent (or skips past)
        self._seen_seq = after_seq  # the newest sequence the pump has read
        self._consumer: str | None = None
        self._sub: PullConsumer | None = None
        self._pump: asyncio.Task[None] | None = None
        self._config = ConsumerConfig(
            description="api push feed (/events/stream)",
            filter_subjects=chosen.subjects(),
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=after_seq + 1,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=settings.inactive_s,
            mem_storage=True,
            num_replicas=1,
            max_waiting=1,
        )

    async def open(self) -> None:
        info = await self._js.add_consumer(EVENTS_STREAM, self._config)
        self._consumer = info.name
        self._sub = await PullConsumer.on(self._js, EVENTS_STREAM, info.name).start()
        self._pump = asyncio.create_task(self._run_pump(), name=f"feed-{info.name}")

    async def close(self) -> None:
        """Release everything the client held; safe to call twice, and while cancelled."""
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._pump
            self._pump = None
        sub, self._sub = self._sub, None
        name, self._consumer = self._consumer, None
        with contextlib.suppress(nats.errors.Error, NotFoundError, TimeoutError):
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                if sub is not None:
                    await sub.stop()
                if name is not None:
                    await self._js.delete_consumer(EVENTS_STREAM, name)

    async def frames(self) -> AsyncIterator[bytes]:
        """SSE frames until the client lags (then a last ``lagged`` frame) or the feed ends."""
        yield f"retry: {RETRY_MS}\n: lodestream event feed\n\n".encode()
        while True:
            if self._lagged:
                yield lagged_frame(self._sent_seq)
                return
            if self._interrupted and self._queue.empty():
                yield interrupted_frame(self._sent_seq)
                return
            # Whatever else is queued goes in the same write: one send per batch, not per
            # event, is what lets one api serve many clients of a busy log.
            frames = [await self._queue.get()]
            while len(frames) < MAX_WRITE and not self._queue.empty():
                frames.append(self._queue.get_nowait())
            self._taken.set()
            for frame in reversed(frames):
                if frame.startswith(b"id: "):
                    self._sent_seq = int(frame[4 : frame.index(b"\n")])
                    break
            chunk = b"".join(frames)
            if chunk:
                yield chunk

    async def _run_pump(self) -> None:
        try:
            while True:
                room = self._queue.maxsize - self._queue.qsize()
                if room == 0:
                    self._taken.clear()
                    try:
                        async with asyncio.timeout(self._settings.lag_s):
                            await self._taken.wait()
                    except TimeoutError:
                        # frames() is blocked sending, not waiting on the queue: it sees
                        # the flag as soon as the client takes what is in flight.
                        self._lagged = True
                        return
                    continue
                await self._fill(room)
        except asyncio.CancelledError:
            raise
        except Exception:
            # NATS gone for good or the consumer removed: end the stream; the client resumes.
            log.exception("push feed %s stopped", self._consumer)
            self._interrupted = True
            with contextlib.suppress(asyncio.QueueFull):
                self._queue.put_nowait(b"")  # wakes frames() if it waits on an empty queue

    async def _fill(self, room: int) -> None:
        assert self._sub is not None
        try:
            msgs = await self._sub.fetch(min(room, MAX_FETCH), timeout=self._settings.heartbeat_s)
        except TimeoutError:
            msgs = []
        framed = 0
        for msg in msgs:
            frame = self._frame(msg)
            if frame is not None:
                self._queue.put_nowait(frame)
                framed += 1
        if not framed and self._queue.empty():
            # Nothing for this client: a comment keeps proxies open, and the id lets a
            # reconnecting client skip what its filter refused.
            self._queue.put_nowait(heartbeat_frame(self._seen_seq))

    def _frame(self, msg: Msg) -> bytes | None:
        seq = int(msg.metadata.sequence.stream)
        self._seen_seq = seq
        found = self._cache.get(seq, msg.subject, msg.data)
        if found is None or not self._filter.accepts(found[0]):
            return None
        return found[1]


def event_frame(seq: int, document: dict[str, object]) -> bytes:
    # orjson writes no line breaks, so the document is one ``data:`` line.
    return b"id: %d\ndata: %s\n\n" % (seq, orjson.dumps(document))


def heartbeat_frame(seen_seq: int) -> bytes:
    return b"id: %d\n: keepalive\n\n" % seen_seq if seen_seq else b": keepalive\n\n"


def lagged_frame(sent_seq: int) -> bytes:
    body = orjson.dumps(
        {
            "last_seq": sent_seq,
            "message": "this client fell behind the feed and was disconnected; "
            "reconnect with Last-Event-ID (or since=) to resume after last_seq",
        }
    )
    return b"event: lagged\ndata: %s\n\n" % body


def interrupted_frame(sent_seq: int) -> bytes:
    body = orjson.dumps(
        {"last_seq": sent_seq, "message": "the event log is unavailable; reconnect to resume"}
    )
    return b"event: interrupted\ndata: %s\n\n" % body
