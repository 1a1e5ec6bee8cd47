"""One JetStream consumer, and one shared history, for every caught-up client of a filter.

A dashboard opened by fifty people asks fifty times for the same events. Read through a
consumer each, every event crosses from nats-server fifty times and is handled fifty
times in the api. Through a hub it crosses once, its frames are joined into one chunk
once, and the chunk goes into the hub's history, from which each client takes what it
has not had yet at its own pace: a client costs one socket write per turn, however many
events that carries, and the memory for all of them is the history's, bounded in bytes
(``hub_history_bytes``) whatever the number of clients.

Only clients near the live edge read a hub. A client that resumes from further back
reads through a consumer of its own (:class:`~lodestream.services.api.feed.LiveFeed`)
and joins the hub when the hub's history reaches back to where it is; a client that
falls so far behind that the history no longer holds its next chunk is handed back to a
consumer of its own at the sequence it reached, where the feed's usual patience applies.
So a slow client never holds the others up, and never makes the api hold more for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

import nats.errors
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from lodestream.eventlog.pull import PullConsumer, fetch_or_pause
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.services.api.feedbox import Outbox
from lodestream.services.api.feedfilter import FeedFilter
from lodestream.services.api.feedframes import FrameCache, accepted_frames, heartbeat_frame
from lodestream.settings import StreamSettings

log = logging.getLogger(__name__)

MAX_FETCH: Final = 256
CLOSE_TIMEOUT_S: Final = 2.0


class Member(Protocol):
    """A client as the hub sees it."""

    outbox: Outbox  # where a client that joins mid-chunk gets the rest of that chunk
    position: int  # the newest sequence it was given, or skipped past
    cursor: int  # the index of the next chunk of the history it has to take

    def leave_hub(self) -> None:
        """The hub can no longer feed it (it fell behind the history, or the hub stopped)."""


@dataclass(frozen=True, slots=True)
class Chunk:
    frames: tuple[tuple[int, bytes], ...]  # (seq, frame); empty for a keepalive
    data: bytes  # the frames joined, or the keepalive
    newest: int  # the sequence the chunk reaches (its last event, or the keepalive's)


def consumer_config(chosen: FeedFilter, after_seq: int, settings: StreamSettings) -> ConsumerConfig:
    """A pull consumer without acks from ``after_seq + 1``: reading it holds nothing."""
    return ConsumerConfig(
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


async def release_consumer(
    js: JetStreamContext, sub: PullConsumer | None, name: str | None
) -> None:
    """Stop reading and delete the consumer; a NATS that is gone leaves it to
    ``inactive_threshold``, and never turns a client's departure into an error."""
    with contextlib.suppress(nats.errors.Error, NotFoundError, TimeoutError):
        async with asyncio.timeout(CLOSE_TIMEOUT_S):
            if sub is not None:
                await sub.stop()
            if name is not None:
                await js.delete_consumer(EVENTS_STREAM, name)


class FeedHub:
    def __init__(
        self,
        js: JetStreamContext,
        chosen: FeedFilter,
        after_seq: int,
        settings: StreamSettings,
        cache: FrameCache,
        *,
        on_end: Callable[[FeedHub], None],
    ) -> None:
        self.filter = chosen
        self._js = js
        self._settings = settings
        self._cache = cache
        self._on_end = on_end
        self._members: set[Member] = set()
        # The history: chunk i (counted from the hub's start) is _chunks[i - _dropped], for
        # i from _base on. A list with a moving start, so a client's read costs what it
        # takes, not the length of the history.
        self._chunks: list[Chunk | None] = []
        self._dropped = 0  # chunks removed from the front of _chunks
        self._base = 0  # the index of the oldest chunk still held
        self._bytes = 0
        self._floor = after_seq  # every accepted event after this is in the history or to come
        self._after_seq = after_seq
        self._seen_seq = after_seq
        self._grown = asyncio.Event()  # replaced each time the history grows
        self._pump: asyncio.Task[None] | None = None
        self._ended = False

    @property
    def members(self) -> int:
        return len(self._members)

    async def open(self) -> None:
        """Create the hub's consumer and start reading it."""
        config = consumer_config(self.filter, self._after_seq, self._settings)
        name = (await self._js.add_consumer(EVENTS_STREAM, config)).name
        try:
            sub = await PullConsumer.on(self._js, EVENTS_STREAM, name).start()
        except BaseException:
            await release_consumer(self._js, None, name)
            raise
        self._pump = asyncio.create_task(self._run(sub, name), name=f"feed-hub-{name}")

    def join(self, member: Member) -> bool:
        """Feed ``member`` from its position on; False when the hub cannot (it stays out)."""
        if self._ended or member.position < self._floor:
            return False
        index = self._base
        for chunk in self._held():
            if chunk.newest > member.position:
                rest = [(seq, f) for seq, f in chunk.frames if seq > member.position]
                if len(rest) != len(chunk.frames):  # it joins in the middle of this chunk
                    if len(rest) > member.outbox.room:
                        return False
                    member.outbox.put(b"".join(f for _, f in rest), len(rest), chunk.newest)
                    member.position = chunk.newest
                    index += 1
                break
            index += 1
        member.cursor = index
        self._members.add(member)
        return True

    def leave(self, member: Member) -> asyncio.Task[None] | None:
        """Stop feeding ``member``; the pump to await when that was the last member (it
        deletes the consumer as it ends)."""
        self._members.discard(member)
        if self._members:
            return None
        self._end()
        return self._pump

    def _drop(self, member: Member) -> None:
        self.leave(member)
        member.leave_hub()

    async def read(self, member: Member) -> tuple[bytes, int] | None:
        """What ``member`` has yet to take (and the newest id in it), waiting for more when
        it has taken everything; None once the hub no longer feeds it."""
        while member in self._members:
            if member.cursor < self._base:
                self._drop(member)  # the history no longer holds what it needs next
                return None
            end = self._dropped + len(self._chunks)
            if member.cursor < end:
                chunks = self._take(member, end)
                if not chunks:
                    continue
                member.position = chunks[-1].newest
                if len(chunks) == 1:
                    return chunks[0].data, member.position
                return b"".join(c.data for c in chunks), member.position
            await self._grown.wait()
        return None

    def _take(self, member: Member, end: int) -> list[Chunk]:
        # From its cursor on, up to about an outbox's worth of bytes: a client far behind in
        # the history is not handed all of it in one write.
        chunks: list[Chunk] = []
        size = 0
        while member.cursor < end and size < member.outbox.limit_bytes:
            chunk = self._chunks[member.cursor - self._dropped]
            member.cursor += 1
            if chunk is not None and chunk.newest > member.position:
                chunks.append(chunk)
                size += len(chunk.data)
        return chunks

    async def _run(self, sub: PullConsumer, name: str) -> None:
        try:
            while not self._ended:
                await self._fill(sub)
        except asyncio.CancelledError:
            raise
        except Exception:
            # NATS gone for good or the consumer removed: its clients go to consumers of
            # their own, which end their streams if the log is unavailable to them too.
            log.exception("push feed hub %s stopped", name)
            self._end()
        finally:
            await release_consumer(self._js, sub, name)

    async def _fill(self, sub: PullConsumer) -> None:
        try:
            msgs = await fetch_or_pause(sub, MAX_FETCH, timeout=self._settings.heartbeat_s)
        except TimeoutError:
            msgs = []
        framed, seen = accepted_frames(self._cache, self.filter, msgs)
        if seen is not None:
            self._seen_seq = seen
        if framed:
            chunk = Chunk(tuple(framed), b"".join(f for _, f in framed), framed[-1][0])
        else:
            # Nothing for its clients: a comment keeps proxies open, and its id lets a
            # client that reconnects skip what its filter refused.
            chunk = Chunk((), heartbeat_frame(self._seen_seq), self._seen_seq)
        self._append(chunk)

    def _held(self) -> list[Chunk]:
        return [c for c in self._chunks[self._base - self._dropped :] if c is not None]

    def _append(self, chunk: Chunk) -> None:
        self._chunks.append(chunk)
        self._bytes += len(chunk.data)
        while self._bytes > self._settings.hub_history_bytes and self._base < self._end_index():
            at = self._base - self._dropped
            oldest = self._chunks[at]
            assert oldest is not None
            self._chunks[at] = None
            self._base += 1
            self._bytes -= len(oldest.data)
            if oldest.frames:
                self._floor = oldest.newest
            for member in [m for m in self._members if m.cursor < self._base]:
                # It had not taken that chunk yet: it falls back to a consumer of its own,
                # where the patience of lag_s applies (it is told if it stays stalled).
                self._drop(member)
        if self._base - self._dropped > max(1024, len(self._chunks) // 2):
            del self._chunks[: self._base - self._dropped]
            self._dropped = self._base
        grown, self._grown = self._grown, asyncio.Event()
        grown.set()

    def _end_index(self) -> int:
        # The newest chunk always stays: a client at the live edge reads it.
        return self._dropped + len(self._chunks) - 1

    def abandon(self) -> None:
        """End the hub now: it is forgotten and its clients go to consumers of their own."""
        self._end()

    def _end(self) -> None:
        if self._ended:
            return
        self._ended = True
        self._on_end(self)
        members, self._members = self._members, set()
        for member in members:
            member.leave_hub()
        self._grown.set()
        if self._pump is not None and self._pump is not asyncio.current_task():
            self._pump.cancel()


class FeedHubs:
    """The hubs of one api, by filter."""

    def __init__(self, cache: FrameCache) -> None:
        self.cache = cache
        self._hubs: dict[FeedFilter, FeedHub] = {}

    def members(self) -> dict[FeedFilter, int]:
        """How many clients each hub feeds now."""
        return {chosen: hub.members for chosen, hub in self._hubs.items()}

    async def join(
        self,
        js: JetStreamContext,
        member: Member,
        chosen: FeedFilter,
        settings: StreamSettings,
        *,
        start: bool,
    ) -> FeedHub | None:
        """The hub now feeding ``member``: its filter's, or one started for it (``start``, for
        a client at the end of the log); None when there is none it can read."""
        hub = self._hubs.get(chosen)
        if hub is None:
            if not start:
                return None
            hub = FeedHub(js, chosen, member.position, settings, self.cache, on_end=self._forget)
            self._hubs[chosen] = hub  # before the await: a client opening meanwhile joins it
            try:
                await hub.open()
            except BaseException:
                hub.abandon()  # and any client that joined it meanwhile
                raise
        return hub if hub.join(member) else None

    def _forget(self, hub: FeedHub) -> None:
        if self._hubs.get(hub.filter) is hub:
            del self._hubs[hub.filter]
