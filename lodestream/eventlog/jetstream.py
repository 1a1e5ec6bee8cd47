"""The JetStream context every lodestream process appends through.

What nats-py 2.16 does not do for us:

* **Refusals reach the ack future** (nats-io/nats.py#985). ``APIError.from_error``
  raises instead of returning, so when the server refuses a ``publish_async`` (a lost
  compare-and-set, error 10071) the exception escapes the reply callback and the ack
  future stays pending until ``EventLog.append_many`` times out on the whole batch.
  :meth:`JetStream._handle_async_reply` puts the error on the future, where the event
  log expects it. It can go once nats-py ships the fix (PR #994).
* **A batch goes out in a few writes** (:meth:`JetStream.publish_batch`). ``publish_async``
  validates, formats and queues every message on its own, which was a third of the API's
  CPU for a 5,000-job submission (issue 15). A batch of :class:`Outgoing` messages is
  already encoded and checked; its ``HPUB`` commands are joined and written per chunk,
  with their acks resolved by the same reply subscription and futures as
  ``publish_async``'s, so refusals, timeouts and the pending limit behave the same.
* **Plain acks are read directly** (:func:`_plain_ack`): one ack per job, so nats-py's
  generic ``json`` and ``from_response`` reading was a tenth of the API's CPU there too.

Every process that appends builds its context with :func:`jetstream`.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Sequence
from typing import Any, Final

import orjson
from nats.errors import (
    ConnectionClosedError,
    ConnectionDrainingError,
    MaxPayloadError,
    OutboundBufferLimitError,
)
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import APIError

from lodestream import natsprivate
from lodestream.eventlog.wire import Outgoing

# nats-py's async reply subjects: <inbox prefix>.<22-char nuid>.<token>
_REPLY_PREFIX_EXTRA: Final = 22 + 2
# Messages per write: enough to amortise the write, few enough that acks of the first
# chunks are read while later ones are formatted.
BATCH_CHUNK: Final = 500
# What the server's ack of a stored message holds; anything more goes nats-py's way.
_PLAIN_ACK_KEYS: Final = frozenset({"stream", "seq", "duplicate", "domain"})


class JetStream(JetStreamContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Reply tokens of batch publishes. nats-py's own tokens are 26 alphanumerics; a
        # "b-" prefix can never equal one, and a counter never repeats within the context.
        self._batch_tokens = itertools.count()

    async def _handle_async_reply(self, msg: Any) -> None:
        token = msg.subject[len(natsprivate.inbox_prefix(self._nc)) + _REPLY_PREFIX_EXTRA :]
        future = self._publish_async_futures.get(token)
        if future is None or future.done():
            return
        ack = _plain_ack(msg)
        if ack is not None:
            future.set_result(ack)
            return
        try:  # a refusal, "no responders", or anything unusual: nats-py's own reading
            await super()._handle_async_reply(msg)
        except APIError as exc:
            if not future.done():
                future.set_exception(exc)

    async def publish_batch(self, messages: Sequence[Outgoing]) -> list[asyncio.Future[PubAck]]:
        """Publish ``messages`` in order, pipelined; one ack future per message.

        Raises before anything is sent when the connection is closed or draining, or when
        a message is over the server's ``max_payload`` (headers included, as the server
        counts it). Nothing here waits for an ack, except for a free slot of
        ``publish_async_max_pending``, as ``publish_async`` does.
        """
        nc = self._nc
        if nc.is_closed:
            raise ConnectionClosedError
        if nc.is_draining_pubs:
            raise ConnectionDrainingError
        too_big = next((m for m in messages if m.size > nc.max_payload), None)
        if too_big is not None:
            raise MaxPayloadError(f"{too_big.subject}: {too_big.size} bytes")
        if not self._async_reply_prefix:
            await self._init_async_reply()
        assert self._async_reply_prefix is not None  # set by _init_async_reply
        reply = self._async_reply_prefix.decode()
        loop = asyncio.get_running_loop()
        slots = self._publish_async_pending_semaphore
        futures: list[asyncio.Future[PubAck]] = []
        unsent: list[tuple[Outgoing, str]] = []  # (message, its reply token)
        try:
            for message in messages:
                if len(unsent) >= BATCH_CHUNK or (unsent and slots.locked()):
                    # Out before waiting for a slot: only the acks of sent messages free one.
                    await self._send(unsent, reply)
                    unsent = []
                await slots.acquire()
                token = f"b-{next(self._batch_tokens):x}"
                future: asyncio.Future[PubAck] = loop.create_future()
                future.add_done_callback(functools.partial(self._batch_done, token))
                self._publish_async_futures[token] = future
                futures.append(future)
                unsent.append((message, token))
            if unsent:
                await self._send(unsent, reply)
                unsent = []
        finally:
            for future in futures[len(futures) - len(unsent) :]:
                future.cancel()  # never sent, so no ack will come: frees its slot
        return futures

    async def _send(self, messages: Sequence[tuple[Outgoing, str]], reply: str) -> None:
        """One write of ``HPUB`` commands, each with its reply subject ``reply`` + token."""
        nc = self._nc
        commands: list[bytes] = []
        for message, token in messages:
            headers, payload = message.headers, message.payload
            commands.append(
                f"HPUB {message.subject} {reply}{token} {len(headers)} "
                f"{len(headers) + len(payload)}\r\n".encode()
            )
            commands += (headers, payload, b"\r\n")
        chunk = b"".join(commands)
        if natsprivate.would_overflow(nc, len(chunk)):
            # Reconnecting: nats-py buffers what fits its pending buffer, and so do we.
            raise OutboundBufferLimitError
        self._publish_async_completed_event.clear()
        nc.stats["out_msgs"] += len(messages)
        nc.stats["out_bytes"] += sum(len(message.payload) for message, _ in messages)
        await natsprivate.write(nc, chunk)

    def _batch_done(self, token: str, _future: asyncio.Future[PubAck]) -> None:
        self._publish_async_futures.pop(token, None)
        if not self._publish_async_futures:
            self._publish_async_completed_event.set()
        self._publish_async_pending_semaphore.release()


def _plain_ack(msg: Any) -> PubAck | None:
    """The ack of a stored message, read without nats-py's generic ``from_response``; None
    for any other reply. One ack per job of a submission, so this is on the API's hot path;
    it gives the same PubAck for the fields a plain (non-batch, non-counter) ack holds."""
    if msg.headers:
        return None
    try:
        reply = orjson.loads(msg.data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(reply, dict) or not _PLAIN_ACK_KEYS.issuperset(reply):
        return None
    stream, seq = reply.get("stream"), reply.get("seq")
    if not isinstance(stream, str) or not isinstance(seq, int):
        return None
    return PubAck(
        stream=stream, seq=seq, domain=reply.get("domain"), duplicate=reply.get("duplicate")
    )


def jetstream(nc: Any, **options: Any) -> JetStream:
    """The JetStream context every lodestream process uses (see the module docstring)."""
    return JetStream(nc, **options)
