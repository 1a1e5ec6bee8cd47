"""Fetching from a durable pull consumer without a timer per message, and the loop around it.

nats-py's ``fetch`` waits for each message of a batch with its own
``wait_for`` (a task per message), which caps a consumer near 10,000
messages/s before any work is done. This fetcher keeps at most one pull
request open per consumer, drains its inbox queue without waiting, and only
ever waits for the *first* message of a batch. Messages that arrive for an
open request while the caller is busy simply wait in the queue for the next
``fetch`` — in order, as JetStream delivered them.

:class:`PullLoop` is the one fetch-and-retry loop of every long-running consumer
(projector, controller, site agent, pilot): a fetch that times out is an empty
batch, a NATS error is logged and waited out (the client reconnects by itself),
and each batch goes to the consumer's own handler, which settles its messages.
:func:`work_and_tick` adds the periodic work of the site agent's modules around it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from lodestream import natsprivate
from lodestream.eventlog.transient import transient
from lodestream.schemas.topology import next_subject

log = logging.getLogger(__name__)

STATUS = "Status"
# On a request's end (408, 409): how many messages of its batch it did not deliver.
PENDING_MESSAGES = "Nats-Pending-Messages"
_ENDS_REQUEST = frozenset({"404", "408", "409"})  # no messages, expired, consumer changed
# No responders: the consumer does not exist (yet: a pilot started as its site is being
# registered, before the controller made the site's consumers). The request is gone at once.
NO_CONSUMER = "503"


class PullConsumer:
    def __init__(
        self, nc: Client, stream: str, durable: str, *, api: str = "$JS.API", top_up: bool = False
    ) -> None:
        self._nc = nc
        # ``api``: the JetStream API prefix; ``$JS.<domain>.API`` from a site's leaf node.
        self._subject = next_subject(stream, durable).replace("$JS.API", api, 1)
        self._sub: Any = None
        self._remaining = 0  # messages the open pull requests may still deliver
        self._open_until = 0.0
        self._no_consumer = False  # the last request was answered "no responders"
        # ``top_up``: while a request is open, ask for more once a fetch wants more than it
        # may still deliver (at most one such request open at a time); see :meth:`fetch`.
        self._top_up = top_up
        self._topped_until = 0.0

    @classmethod
    def on(cls, js: Any, stream: str, durable: str, *, top_up: bool = False) -> PullConsumer:
        """A consumer on ``js``'s connection, not started yet."""
        return cls(natsprivate.connection_of(js), stream, durable,
                   api=natsprivate.api_prefix(js), top_up=top_up)  # fmt: skip

    async def start(self) -> PullConsumer:
        """Subscribe a fresh inbox; after :meth:`stop`, also to start over on a new consumer."""
        self._remaining = 0  # no pull request is open on a fresh inbox
        self._open_until = 0.0
        self._topped_until = 0.0
        self._inbox = self._nc.new_inbox()
        self._sub = await self._nc.subscribe(
            self._inbox, pending_msgs_limit=1_000_000, pending_bytes_limit=1 << 30
        )
        return self

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    async def fetch(self, batch: int, timeout: float) -> list[Msg]:  # noqa: ASYNC109 - also the pull expiry sent to the server
        """Up to ``batch`` messages: what is there now, or the first to come within ``timeout``.

        A request's batch counts every message the server sends to it, work or not. A reader
        that settles some deliveries without taking up the room it fetched for (a pilot acks
        the ``job.created`` of a job not created runnable) is left with a request smaller
        than its room; with ``top_up`` it asks for the difference at once, instead of once
        that request has run out, while its peers' requests take the burst it had room for.
        """
        queue = natsprivate.pending_queue(self._sub)
        loop = asyncio.get_running_loop()
        msgs = self._drain(queue, batch)
        want, now = batch - len(msgs), loop.time()
        if want > 0 and (self._remaining <= 0 or now > self._open_until):
            await self._request(want, timeout)
        elif self._top_up and want > self._remaining > 0 and now > self._topped_until:
            self._topped_until = now + timeout
            await self._request(want - self._remaining, timeout, more=True)
        if not msgs:
            try:
                first = await asyncio.wait_for(queue.get(), timeout)
            except TimeoutError:
                return []
            self._account(first)
            if self._is_data(first):
                msgs.append(first)
            msgs += self._drain(queue, batch - len(msgs))
        if not msgs and self._no_consumer:
            # Raised, not an empty batch: the pull loop waits before asking again, instead
            # of asking in a tight loop (and, before this, waited out the request's expiry
            # and a second more, which held a pilot's first job ~1.3 s).
            self._no_consumer = False
            raise nats.errors.NoRespondersError
        return msgs

    async def _request(self, count: int, expires_s: float, *, more: bool = False) -> None:
        """Ask for ``count`` more messages within ``expires_s`` (``more``: beside the open
        request; else instead of it, which has ended or is lost)."""
        request = {"batch": count, "expires": int(expires_s * 1e9)}
        self._remaining = self._remaining + count if more else count
        self._open_until = asyncio.get_running_loop().time() + expires_s + 1.0
        await self._nc.publish(self._subject, json.dumps(request).encode(), reply=self._inbox)

    def _drain(self, queue: asyncio.Queue[Msg], limit: int) -> list[Msg]:
        msgs: list[Msg] = []
        while len(msgs) < limit:
            try:
                msg = queue.get_nowait()
            except asyncio.QueueEmpty:
                break
            self._account(msg)
            if self._is_data(msg):
                msgs.append(msg)
        return msgs

    def _account(self, msg: Msg) -> None:
        self._sub._pending_size -= len(msg.data)
        if self._is_data(msg):
            self._remaining -= 1
        elif msg.headers and msg.headers.get(STATUS) in _ENDS_REQUEST:
            # One request ended: what it did not deliver, when the server says (2.9 and
            # later), is no longer to come; the rest of a top-up's may still be.
            pending = msg.headers.get(PENDING_MESSAGES, "")
            self._remaining = max(0, self._remaining - int(pending)) if pending.isdigit() else 0
        elif msg.headers and msg.headers.get(STATUS) == NO_CONSUMER:
            self._remaining = 0
            self._no_consumer = True

    @staticmethod
    def _is_data(msg: Msg) -> bool:
        return not (msg.headers and STATUS in msg.headers and not msg.data)


# How long a reader that loops on its own pauses after a request answered "no responders".
NO_CONSUMER_WAIT_S = 0.5


async def fetch_or_pause(sub: PullConsumer, batch: int, timeout: float) -> list[Msg]:  # noqa: ASYNC109 - as PullConsumer
    """:meth:`PullConsumer.fetch` for a reader that loops on its own (a rebuild's read, the
    API's push feeds): a request answered "no responders" (its consumer not made yet, or a
    cluster still choosing the consumer's leader) is an empty fetch after a short pause, as
    it was before the fetch said so, instead of an error that ends the reader."""
    try:
        return await sub.fetch(batch, timeout)
    except nats.errors.NoRespondersError:
        await asyncio.sleep(min(timeout, NO_CONSUMER_WAIT_S))
        return []


async def pull_consumer(
    js: Any, stream: str, durable: str, *, top_up: bool = False
) -> PullConsumer:
    """A started :class:`PullConsumer` on ``js``'s connection."""
    return await PullConsumer.on(js, stream, durable, top_up=top_up).start()


BatchHandler = Callable[[list[Msg]], Awaitable[None]]

# What one fetch hands out: nats-py's messages, or what a reader makes of the bytes (the
# projector reads EVENTS past nats-py's messages, see rawpull.py).
Item = TypeVar("Item")


class Fetcher(Protocol[Item]):
    """What :class:`PullLoop` pulls from: :class:`PullConsumer`, or a reader like it."""

    async def fetch(self, batch: int, timeout: float) -> list[Item]: ...  # noqa: ASYNC109 - as PullConsumer


class PullLoop(Generic[Item]):
    """Fetch batches from ``sub`` and hand each non-empty one to a handler, until stopped.

    ``batch`` is a size or a function asked before every fetch (a pilot fetches only what
    it has room for); so is ``timeout_s``, how long a fetch waits for its first message (a
    pilot varies it, so that its pull requests do not stay in step with its peers'). What
    the handler raises is not caught here: the consumer kernel
    (:mod:`lodestream.eventlog.kernel`) decides what a failed batch or delivery means.
    """

    def __init__(
        self,
        sub: Fetcher[Item],
        *,
        name: str,
        batch: int | Callable[[], int],
        timeout_s: float | Callable[[], float],
        retry_after_s: float = 0.5,
    ) -> None:
        self.sub = sub
        self.name = name
        self._batch = batch if callable(batch) else lambda: batch
        self._timeout_s = timeout_s if callable(timeout_s) else lambda: timeout_s
        self._retry_after_s = retry_after_s

    async def fetch(self) -> list[Item]:
        """One batch; empty when nothing came within the timeout or NATS is away."""
        try:
            return await self.sub.fetch(self._batch(), timeout=self._timeout_s())
        except TimeoutError:  # nats-py raises its own subclass or plain asyncio.TimeoutError
            return []
        except Exception as exc:  # reconnecting, closed, no responders, API errors
            if not transient(exc):
                raise
            log.warning("%s: fetch failed (%s); retrying", self.name, _reason(exc))
            await asyncio.sleep(self._retry_after_s)
            return []

    async def once(self, handle: Callable[[list[Item]], Awaitable[None]]) -> None:
        """Fetch one batch and hand it on, if anything came."""
        msgs = await self.fetch()
        if msgs:  # also empty after a status message only
            await handle(msgs)

    async def run(
        self, handle: Callable[[list[Item]], Awaitable[None]], stop: asyncio.Event
    ) -> None:
        while not stop.is_set():
            await self.once(handle)


def stream_seq(msg: Any) -> int:
    """The stream sequence a delivery carries."""
    # Read from the reply subject's one token: ``msg.metadata`` builds a dataclass and a
    # datetime per message, a measurable part of a consumer's time at tens of thousands a
    # second. $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.… (9 tokens), or with
    # a domain and an account hash $JS.ACK.<domain>.<hash>.<stream>.….<stream seq>.… (11+).
    tokens = (msg.reply or "").split(".")
    if tokens[0] == "$JS" and tokens[1:2] == ["ACK"]:
        if len(tokens) == 9:
            return int(tokens[5])
        if len(tokens) >= 11:
            return int(tokens[7])
    return int(msg.metadata.sequence.stream)  # not an ack subject: nats-py raises why


async def work_and_tick(
    pulling: PullLoop[Msg],
    handle: BatchHandler,
    tick: Callable[[], Awaitable[None]],
    interval_s: float,
    stop: asyncio.Event,
) -> None:
    """Hand each fetched batch to ``handle`` and run ``tick`` every ``interval_s`` between
    fetches, until ``stop``: a site module's loop (deliveries, then its periodic sync).

    A tick that raises is logged and the next one runs as planned: a bug in one sync must
    not end the module.
    """
    next_tick = 0.0
    while not stop.is_set():
        await pulling.once(handle)
        if time.monotonic() >= next_tick:
            try:
                await tick()
            except Exception:
                log.exception("%s: periodic work failed; it runs again next time", pulling.name)
            next_tick = time.monotonic() + interval_s


def _reason(exc: Exception) -> str:
    return str(exc) or type(exc).__name__
