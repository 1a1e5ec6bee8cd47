"""A pull consumer for bulk readers, taking its deliveries as bytes, not as nats-py messages.

nats-py builds a :class:`~nats.aio.msg.Msg` for every delivery: it parses the header block
into a dict (every event on ``EVENTS`` carries ``Nats-Msg-Id``), decodes the reply subject,
queues the message, and a reader then splits the reply again for the stream sequence. For
a replay of the whole log that is about half the cost of reading it. :class:`RawPull`
takes the deliveries to its own inbox straight from the connection's protocol parser and
keeps only what a bulk reader needs: the stream sequence and the count still pending
(both from the ``$JS.ACK`` reply subject), the subject, the body, and the reply subject
itself (the bytes the parser already holds), which is what an ack is published to. Headers
are not read, except a status line that ends a pull request. Every other subscription on
the connection is delivered by nats-py as before.

As in :class:`~lodestream.eventlog.pull.PullConsumer`, only the first message of a batch is
waited for; unlike it, the next batch is asked for before this one is handed out, so the
server sends while the reader works (the consumer must allow two waiting pull requests).

A reader that wants only some subjects (one process of a replay split by aggregate) passes
``keep``: the others are dropped before anything of them is parsed, and :attr:`RawPull.position`
still says how far the consumer has delivered, kept or not.
A reader that hands the messages on to other processes (the parent of a split replay) takes
them with :meth:`RawPull.fetch_wire`, as the parser gave them, and leaves the parsing
(:func:`delivery_of`) to those processes.

For a consumer that acks, that look-ahead is one batch delivered and not yet acked while the
reader works on the one before: its ``max_ack_pending`` must leave room for two batches, and
its ``ack_wait`` is what a reader that stalls longer is redelivered after.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final, NamedTuple

from nats.aio.client import Client

from lodestream import natsprivate
from lodestream.eventlog.errors import ReadError
from lodestream.schemas.topology import next_subject

Take = Callable[[bytes, bytes, bytes, bytes | None], None]
Keep = Callable[[bytes], bool]
Wire = tuple[bytes, bytes, bytes, bytes | None]
"""A message as the connection's parser gave it: subject, reply subject, body, headers."""

_ROUTES: Final = "_lodestream_raw_routes"
_ACK_PREFIX: Final = b"$JS.ACK."
_V1_TOKENS: Final = 9  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
_V2_SHIFT: Final = 2  # a domain and an account hash come after $JS.ACK
_STATUS_AT: Final = len(b"NATS/1.0 ")  # an inline status: "NATS/1.0 408 Request Timeout"
_ENDS_REQUEST: Final = frozenset({b"404", b"408", b"409"})  # no messages, expired, changed
_NO_RESPONDERS: Final = b"503"  # nothing listens on the consumer's subject: it is gone


class Delivery(NamedTuple):
    """One message of the stream: its sequence, how many the consumer still held, its
    subject and body, and the reply subject its ack goes to."""

    seq: int
    pending: int
    subject: str
    data: bytes
    reply: bytes


class Position(NamedTuple):
    """The last message a consumer delivered: its sequence, and how many it still held."""

    seq: int
    pending: int


class RawPull:
    """A pull consumer on ``nc`` for the durable or ephemeral consumer ``name`` of ``stream``;
    with ``keep``, only the messages whose subject (bytes) it keeps are handed out.

    :meth:`start` before fetching, :meth:`stop` always; :meth:`start` again after
    :meth:`stop` reads on a fresh inbox (for a consumer re-created meanwhile).
    """

    def __init__(
        self, nc: Client, stream: str, name: str, keep: Keep | None = None, *,
        api: str = "$JS.API",
    ) -> None:  # fmt: skip
        self._nc = nc
        self._keep = keep
        self.position: Position | None = None  # None: nothing delivered yet
        # ``api``: the JetStream API prefix, as for PullConsumer.
        self._subject = next_subject(stream, name).replace("$JS.API", api, 1)
        self._sid: int | None = None
        self._inbox = ""
        self._got: list[Wire] = []
        self._waiter: asyncio.Future[None] | None = None
        self._remaining = 0  # messages the open pull requests may still deliver
        self._open_until = 0.0

    @classmethod
    def on(cls, js: Any, stream: str, name: str) -> RawPull:
        """A reader on ``js``'s connection and API prefix, not started yet."""
        return cls(natsprivate.connection_of(js), stream, name, api=natsprivate.api_prefix(js))

    async def start(self) -> RawPull:
        # Nothing of an earlier inbox is kept: what it held was sent by a consumer that may
        # since have been deleted, and no request of it is open on the new inbox.
        self._got = []
        self._remaining = 0
        self._open_until = 0.0
        self._inbox = self._nc.new_inbox()
        # Subscribed through nats-py, so the server routes the inbox here and a reconnect
        # subscribes it again; its deliveries never reach the subscription's queue.
        sub = await self._nc.subscribe(self._inbox)
        self._sid = natsprivate.subscription_id(sub)
        _routes(self._nc)[self._sid] = self._take
        return self

    async def stop(self) -> None:
        if self._sid is None:
            return
        sid, self._sid = self._sid, None
        # Unsubscribed first: what the open requests still send until the server has the
        # UNSUB comes here and is dropped, never into nats-py's queue for the inbox.
        sub = natsprivate.subscription(self._nc, sid)
        if sub is not None:
            await sub.unsubscribe()
        _unroute(self._nc, sid)

    async def ack(self, delivery: Delivery) -> None:
        """Acknowledge ``delivery``; on an AckAll consumer, every delivery up to it.

        Not waited for, as nats-py's ``Msg.ack``: an ack lost to an outage only means the
        server delivers again after ``ack_wait``.
        """
        await self._nc.publish(delivery.reply.decode())

    async def fetch(self, batch: int, timeout: float) -> list[Delivery]:  # noqa: ASYNC109 - also the pull expiry sent to the server
        """Up to ``batch`` messages: what is there now, or the first to come within ``timeout``
        (none if all there is now are messages ``keep`` leaves out: see :attr:`position`)."""
        return [delivery_of(wire) for wire in await self.fetch_wire(batch, timeout)]

    async def fetch_wire(self, batch: int, timeout: float) -> list[Wire]:  # noqa: ASYNC109 - also the pull expiry sent to the server
        """As :meth:`fetch`, the messages as they came off the wire, nothing of them parsed:
        for a reader that hands them on to other processes, which parse them
        (:func:`delivery_of`) on their own cores."""
        loop = asyncio.get_running_loop()
        was = self.position
        got = self._drain(batch)
        # The next batch is asked for while this one is worked on, so that the server is
        # sending it meanwhile: two requests may be open (the consumer's max_waiting ≥ 2).
        if self._remaining < batch or loop.time() > self._open_until:
            request = {"batch": batch, "expires": int(timeout * 1e9)}
            self._remaining = max(self._remaining, 0) + batch
            self._open_until = loop.time() + timeout + 1.0
            await self._nc.publish(self._subject, json.dumps(request).encode(), reply=self._inbox)
        # Nothing kept but messages left out: the caller hears where the consumer is now
        # rather than after the next message (there may be none: the range may end here).
        if not got and self.position == was:
            if not self._got:
                self._waiter = loop.create_future()
                try:
                    await asyncio.wait_for(self._waiter, timeout)
                except TimeoutError:
                    return []
                finally:
                    self._waiter = None
            got = self._drain(batch)
        return got

    async def wires_until(
        self, last: int, pending: int, *, batch: int, fetch_timeout_s: float,
        pending_now: Callable[[], Awaitable[int]] | None = None,
    ) -> AsyncIterator[list[Wire]]:  # fmt: skip
        """Batches of :meth:`fetch_wire` until the consumer has delivered sequence ``last``, or
        has nothing left to deliver; ``pending``: what it held when it was created.

        The last batch may hold some past ``last``: the caller drops them. While nothing has
        been delivered yet, a fetch that brings nothing asks ``pending_now`` (if given) what
        the consumer holds now: a range whose messages were purged meanwhile then ends.
        """
        while pending:
            wires = await self.fetch_wire(batch, fetch_timeout_s)
            if wires:
                yield wires
            # Where the consumer is, whether this reader kept its last messages or not: past
            # the range's end, or with none left to send (they arrive in order).
            at = self.position
            if at is not None:
                pending = 0 if at.seq >= last else at.pending
            elif not wires and pending_now is not None:
                pending = await pending_now()

    def _take(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        # Called by the protocol parser for every delivery: nothing here but keeping it.
        self._got.append((subject, reply, data, headers))
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _drain(self, limit: int) -> list[Wire]:
        """Up to ``limit`` messages of what arrived, status messages accounted and left out,
        and those ``keep`` refuses too (only the last reply is parsed, for :attr:`position`)."""
        got = self._got
        keep = self._keep
        wires: list[Wire] = []
        append = wires.append
        taken = 0
        passed: bytes | None = None  # the reply of the last message left out, if it was last
        try:
            for wire in got:
                subject, reply, data, headers = wire
                taken += 1
                if (
                    headers is not None
                    and not data
                    and headers[_STATUS_AT - 1 : _STATUS_AT] == b" "
                ):
                    status = headers[_STATUS_AT : _STATUS_AT + 3]
                    if status == _NO_RESPONDERS:
                        # Asked again and again, it would answer the same for ever.
                        raise ReadError("no consumer answers the pull request (503): the "
                                        "consumer, or its stream, was deleted")  # fmt: skip
                    if status in _ENDS_REQUEST:
                        self._remaining = 0
                    continue  # a heartbeat or flow control: nothing of the stream
                self._remaining -= 1
                if keep is not None and not keep(subject):
                    passed = reply
                    continue
                passed = None
                append(wire)
                if len(wires) == limit:
                    break
        finally:
            # Also past a delivery that raised: it must not be read again on the next fetch.
            del got[:taken]
        if passed is None and wires:
            passed = wires[-1][1]
        if passed is not None:
            self.position = Position(*position_of(passed))
        return wires


def delivery_of(wire: Wire) -> Delivery:
    """The :class:`Delivery` of a message as :meth:`RawPull.fetch_wire` gave it."""
    subject, reply, data, _ = wire
    return _delivery(subject, reply, data)


def _delivery(subject: bytes, reply: bytes, data: bytes) -> Delivery:
    seq, pending = position_of(reply)
    # A subject need not be UTF-8 (see natsconn.TolerantClient): decoded with replacement
    # characters, it fails the shared rule downstream instead of failing the read here.
    return Delivery(seq, pending, subject.decode(errors="replace"), data, reply)


def position_of(reply: bytes) -> tuple[int, int]:
    """The stream sequence and the count still pending, from a delivery's reply subject."""
    tokens = reply.split(b".")
    shift = 0 if len(tokens) == _V1_TOKENS else _V2_SHIFT
    if not reply.startswith(_ACK_PREFIX) or len(tokens) < _V1_TOKENS + shift:
        raise ReadError(f"not a JetStream delivery: reply subject {reply!r}")
    return int(tokens[5 + shift]), int(tokens[8 + shift])


def _routes(nc: Client) -> dict[int, Take]:
    """The connection's raw routes by subscription id, installed in front of its delivery."""
    routes: dict[int, Take] | None = nc.__dict__.get(_ROUTES)
    if routes is None:
        routes = {}
        deliver = natsprivate.delivery_of(nc)
        route = routes.get

        async def process_msg(
            sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None
        ) -> None:
            take = route(sid)
            if take is None:
                await deliver(sid, subject, reply, data, headers)
            else:
                take(subject, reply, data, headers)

        nc.__dict__[_ROUTES] = routes
        natsprivate.replace_delivery(nc, process_msg)
    return routes


def _unroute(nc: Client, sid: int) -> None:
    routes: dict[int, Take] = nc.__dict__.get(_ROUTES, {})
    routes.pop(sid, None)
    if not routes:  # the last raw reader gone: nats-py's own delivery, untouched
        nc.__dict__.pop(_ROUTES, None)
        natsprivate.restore_delivery(nc)
