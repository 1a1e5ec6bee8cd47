"""One site's events, read from ``EVENTS`` through a consumer the watch owns.

The consumer is pull-based, filtered to ``evt.<site>.>``, with no acks: the server keeps
nothing for it but a position, and sends only what was asked for. It is this feed's alone
(:mod:`lodestream.client.watchslots`: a create never attaches to an existing consumer).
A watcher that stops asking (its caller is slow, or gone) costs the server no memory; after
:data:`INACTIVE_S` without a pull the server deletes the consumer, and the feed re-creates
it at the next sequence and says so (a :class:`~lodestream.client.errors.WatchNotice`).

Two pull requests' worth of messages at most are in flight, so a new event reaches the
caller as soon as it is stored (a pull request waits on the server) while replay runs at
full speed. A request that expires (408) is replaced at once, so one is always waiting and
the server's idle heartbeats never stop on a healthy, idle stream. Every message carries
its stream and consumer sequences; a consumer sequence that skips (nats-py dropped
messages of a subscription that overflowed), heartbeats that stop (the connection or the
consumer is gone) or a pull the server ends make the feed start again from the sequence
after the last one it handed out, so nothing is missed and nothing repeated.

The feed's :attr:`SiteFeed.position` is the first sequence it has not handed out: where it
started (``"now"`` and a time resolved to a sequence when the consumer is made), then one
past the last event delivered. A start the log no longer holds is refused with
:class:`~lodestream.client.errors.WatchGap`, never moved silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from lodestream.client.errors import WatchError, WatchGap
from lodestream.client.watchslots import claim
from lodestream.infra.nats.monitor import consumer_names
from lodestream.schemas.subjects import EVENTS_STREAM

BATCH: Final = 2048
EXPIRES_S: Final = 10.0
HEARTBEAT_S: Final = 1.0
INACTIVE_S: Final = 30.0
API_TIMEOUT_S: Final = 5.0
_NS: Final = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Start:
    """Where a consumer starts: a stream sequence, a time, or only what is new."""

    seq: int | None = None
    time: datetime | None = None

    def config(self) -> dict[str, Any]:
        if self.seq is not None:
            return {"deliver_policy": "by_start_sequence", "opt_start_seq": self.seq}
        if self.time is not None:
            return {"deliver_policy": "by_start_time", "opt_start_time": self.time.isoformat()}
        return {"deliver_policy": "new"}


class Restart(Exception):  # a signal inside the watch, never raised to its callers
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class _Signalling(asyncio.Queue[Msg]):
    """A subscription's queue that also wakes the watch waiting on any of its feeds."""

    def __init__(self, ready: asyncio.Event, maxsize: int) -> None:
        super().__init__(maxsize)
        self._ready = ready

    def put_nowait(self, item: Msg) -> None:
        super().put_nowait(item)
        self._ready.set()


class SiteFeed:
    """Pull one site's events; :meth:`take` returns raw messages in stream order."""

    def __init__(
        self,
        nc: Client,
        public_key: str,
        site: str,
        start: Start,
        *,
        inactive_s: float = INACTIVE_S,
        errors: list[Exception] | None = None,
        ready: asyncio.Event | None = None,
    ) -> None:
        self.site = site
        self._errors = errors if errors is not None else []  # what the server told the client
        self._inactive_s = inactive_s
        self._nc = nc
        self._names = consumer_names(public_key)
        self._name: str | None = None
        self._start = start
        # Set whenever a message arrives: one event for every feed of a watch, so that it
        # waits on all its sites at once.
        self.ready = ready if ready is not None else asyncio.Event()
        self.position: int | None = start.seq  # the first sequence not handed out yet
        self.last_seq: int | None = None  # the last stream sequence handed out
        self._cseq = 0
        self._asked = 0  # messages requested and not yet received, expired or refused
        self._broken: str | None = None  # why the feed must start again, once drained
        self._queue: asyncio.Queue[Msg] = asyncio.Queue()
        self._sub: Any = None
        self._inbox = ""
        self._heard = time.monotonic()
        # What the server still holds for this feed: after the last message, or (before any)
        # from where the consumer started.
        self.pending = 0

    async def open(self) -> None:
        """Create a consumer of this feed's own under a free name of the key's, and pull."""
        self._inbox = self._nc.new_inbox()
        self._sub = await self._nc.subscribe(self._inbox, pending_msgs_limit=4 * BATCH)
        # Read straight from the subscription's queue, as eventlog.pull does: a callback would
        # cost a task switch per message. Its byte count is kept by hand (_take). No message
        # can have arrived yet: nothing was asked for on this inbox.
        self._queue = self._sub._pending_queue = _Signalling(self.ready, 4 * BATCH)
        start = self._start if self.position is None else Start(seq=self.position)
        claimed = await claim(self._api, self._names, self.site, self._config(start))
        self._name, self.pending = claimed.name, claimed.pending
        if start.seq is not None and claimed.floor + 1 != start.seq:
            await self.close()
            raise WatchGap(
                f"site {self.site}: the log no longer holds sequence {start.seq} (its first is "
                f"{claimed.floor + 1}); events in between may be lost: start again with "
                f"since={claimed.floor + 1} to go on without them"
            )
        # "now" and a time resolve to a sequence here, once: a restart before the first
        # event, and the caller's cursor, start where this consumer did.
        self.position = claimed.floor + 1
        self._cseq, self._asked, self._broken = 0, 0, None
        self._heard = time.monotonic()
        await self._pull()

    async def close(self) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            with contextlib.suppress(NatsError):
                await sub.unsubscribe()
        if self._name is not None and self._nc.is_connected:
            name, self._name = self._name, None
            # If this fails, the server drops the consumer by itself after inactive_s.
            with contextlib.suppress(NatsError, TimeoutError, WatchError):
                await self._api(f"$JS.API.CONSUMER.DELETE.{EVENTS_STREAM}.{name}", b"")

    async def restart(self) -> None:
        await self.close()
        await self.open()

    async def take(self) -> list[tuple[int, Msg]]:
        """The messages received so far, each with its stream sequence; no wait.

        Raises :class:`Restart` when the feed must start again at :attr:`position` (after
        handing out, in an earlier call, everything received before the break).
        """
        if self._broken is not None:
            raise Restart(self._broken)
        msgs: list[tuple[int, Msg]] = []
        while self._broken is None and not self._queue.empty():
            msg = self._queue.get_nowait()
            self._heard = time.monotonic()
            if self._take(msg):
                msgs.append((msg.metadata.sequence.stream, msg))
        if not msgs:
            if self._broken is not None:
                raise Restart(self._broken)
            if time.monotonic() - self._heard > 3 * HEARTBEAT_S:
                raise Restart("no heartbeat from the server")
        if self._broken is None and self._asked < BATCH:
            await self._pull()
        return msgs

    async def next_batch(self, timeout_s: float) -> list[tuple[int, Msg]]:
        """:meth:`take`, waiting up to ``timeout_s`` for the first message."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.ready.clear()
            msgs = await self.take()
            left = deadline - time.monotonic()
            if msgs or left <= 0:
                return msgs
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ready.wait(), min(left, HEARTBEAT_S))

    def _take(self, msg: Msg) -> bool:
        """Account for ``msg``; True if it is an event to hand out."""
        self._sub._pending_size -= len(msg.data)
        status = (msg.headers or {}).get("Status")
        if status is None:
            meta = msg.metadata
            if meta.sequence.consumer != self._cseq + 1:
                self._broken = f"delivery {meta.sequence.consumer} after {self._cseq}: a gap"
                return False
            self._cseq = meta.sequence.consumer
            self._asked -= 1
            self.last_seq = meta.sequence.stream
            self.position = self.last_seq + 1
            self.pending = meta.num_pending
            return True
        if status == "100":
            return False  # idle heartbeat (or flow control, which pull consumers do not use)
        if status == "408":  # a pull request expired; what it did not deliver is not coming
            self._asked -= int((msg.headers or {}).get("Nats-Pending-Messages", "0") or 0)
            return False
        description = (msg.headers or {}).get("Description", "")
        self._broken = f"the server ended the pull: {status} {description}".strip()
        return False

    async def _pull(self) -> None:
        want = 2 * BATCH - self._asked
        if want < BATCH:
            return
        # A waiting pull request keeps the consumer alive: it must end well before the server
        # would drop a consumer nobody pulls from, or a stalled caller would never be noticed.
        expires = min(EXPIRES_S, self._inactive_s / 2)
        heartbeat = min(HEARTBEAT_S, expires / 2)
        request = {
            "batch": want,
            "expires": int(expires * _NS),
            "idle_heartbeat": int(heartbeat * _NS),
        }
        await self._nc.publish(
            f"$JS.API.CONSUMER.MSG.NEXT.{EVENTS_STREAM}.{self._name}",
            json.dumps(request).encode(),
            reply=self._inbox,
        )
        if self._asked <= 0:
            self._heard = time.monotonic()  # the heartbeats of a new request start now
        self._asked += want

    def _config(self, start: Start) -> dict[str, Any]:
        return {
            "filter_subject": f"evt.{self.site}.>",
            "ack_policy": "none",
            "replay_policy": "instant",
            "inactive_threshold": int(self._inactive_s * _NS),
            "mem_storage": True,
            "num_replicas": 1,
            "max_waiting": 4,
            **start.config(),
        }

    async def _api(self, subject: str, payload: bytes) -> dict[str, Any]:
        try:
            reply = await self._nc.request(subject, payload, timeout=API_TIMEOUT_S)
        except TimeoutError as exc:
            refused = f'permissions violation for publish to "{subject.lower()}"'
            if any(refused in str(e).lower() for e in self._errors):
                raise WatchError(
                    f"cannot watch site {self.site!r}: this monitoring credential may not read "
                    "it (not one of your sites, or registered after the credential was applied)"
                ) from exc
            raise WatchError(
                f"no answer from JetStream on {subject} (is the credential still valid?)"
            ) from exc
        answer: dict[str, Any] = json.loads(reply.data) if reply.data else {}
        return answer
