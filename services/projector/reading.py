"""How the projector reads a stream: ``EVENTS`` as bytes, ``HB`` as nats-py's messages.

Every stored event carries a ``Nats-Msg-Id`` header the projector never reads, and nats-py
would parse it into a dict, build a message object around it and leave the stream
sequence in a reply subject to split again: a sixth of the projector's time. ``EVENTS``
is therefore read with :class:`~lodestream.eventlog.rawpull.RawPull`, which hands out the
bytes. ``HB`` stays on :class:`~lodestream.eventlog.pull.PullConsumer`: the server's expiry
markers are told from heartbeats by their headers.

Both readers hand out :class:`RawMessage` batches and, after the caller's commit, ack a
batch with one ack of its last message (the live consumer is AckAll). The caller takes a
batch's :meth:`~StreamReader.mark` when it is handed out and acks by it later: by then
the next batch may have been handed out, and must not be acked with it.
"""

from __future__ import annotations

from typing import Any, Protocol, cast

from nats.aio.msg import Msg

from lodestream.eventlog.pull import PullConsumer, fetch_or_pause, stream_seq
from lodestream.eventlog.rawpull import Delivery, RawPull
from lodestream.schemas.subjects import HB_STREAM
from lodestream.services.projector.messages import RawMessage


class StreamReader(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def fetch(self, batch: int, timeout: float) -> list[RawMessage]: ...  # noqa: ASYNC109 - as PullConsumer

    def mark(self) -> object:
        """The last message of the last batch :meth:`fetch` handed out, to :meth:`ack` later."""

    async def ack(self, mark: object) -> None:
        """Ack everything up to ``mark``."""


def stream_reader(js: Any, stream: str, consumer: str) -> StreamReader:
    """The reader for ``consumer`` of ``stream`` on ``js``'s connection, not started yet."""
    if stream == HB_STREAM:
        return MessageReader(PullConsumer.on(js, stream, consumer), stream)
    return BytesReader(RawPull.on(js, stream, consumer), stream)


def raw_from_msg(stream: str, msg: Any) -> RawMessage:
    return RawMessage(
        stream=stream,
        seq=stream_seq(msg),
        subject=msg.subject,
        data=msg.data,
        # Only HB's markers are read by their headers; an event's are the publisher's own.
        headers=dict(msg.headers) if msg.headers and stream == HB_STREAM else None,
    )


class BytesReader:
    """Deliveries taken as bytes from the protocol parser (no headers)."""

    def __init__(self, pull: RawPull, stream: str) -> None:
        self._pull = pull
        self._stream = stream
        self._last: Delivery | None = None

    async def start(self) -> None:
        self._last = None
        await self._pull.start()

    async def stop(self) -> None:
        await self._pull.stop()

    async def fetch(self, batch: int, timeout: float) -> list[RawMessage]:  # noqa: ASYNC109 - as PullConsumer
        deliveries = await self._pull.fetch(batch, timeout)
        if not deliveries:
            return []
        self._last = deliveries[-1]
        stream = self._stream
        return [RawMessage(stream, d.seq, d.subject, d.data) for d in deliveries]

    def mark(self) -> object:
        return self._last

    async def ack(self, mark: object) -> None:
        if isinstance(mark, Delivery):
            await self._pull.ack(mark)


class MessageReader:
    """nats-py's messages, headers included."""

    def __init__(self, sub: PullConsumer, stream: str) -> None:
        self._sub = sub
        self._stream = stream
        self._last: Any = None

    async def start(self) -> None:
        self._last = None
        await self._sub.start()

    async def stop(self) -> None:
        await self._sub.stop()

    async def fetch(self, batch: int, timeout: float) -> list[RawMessage]:  # noqa: ASYNC109 - as PullConsumer
        msgs = await fetch_or_pause(self._sub, batch, timeout)
        if not msgs:
            return []
        self._last = msgs[-1]
        return [raw_from_msg(self._stream, m) for m in msgs]

    def mark(self) -> object:
        return self._last

    async def ack(self, mark: object) -> None:
        if mark is not None:
            await cast(Msg, mark).ack()
