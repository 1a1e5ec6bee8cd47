"""Live events of the user's sites, read straight from JetStream: :func:`watch`.

::

    async with watch(credential, sites=["alpha"], since=1) as w:
        async for item in w:
            print(item.seq, item.event.type)

    for item in watch_sync(credential, sites=["alpha"], since="now"):   # the same, blocking
        ...

``async with`` closes the connection as soon as the block is left, ``break`` included; a
bare ``async for`` over :func:`watch` closes it only when the iterator is collected, which
may be after its event loop has gone.

The connection is wss:// with the user's monitoring credential
(:mod:`lodestream.client.credential`), whose nats-server permissions allow reading
the user's own sites and nothing else (:mod:`lodestream.infra.nats.monitor`). One
consumer per site, owned by this watch alone (:class:`~lodestream.client.watchfeed.SiteFeed`,
:mod:`lodestream.client.watchslots`); each site's events arrive in stream order, each with
its stream sequence.

Resuming: :attr:`Watch.positions` holds, for every site watched, the first sequence not yet
handed out: where the watch started (``"now"`` or a time resolved to a sequence when the
watch opens) until the site delivers, then one past its last event. After any break (a
reconnect, a consumer the server dropped, messages lost to an overflowing subscription)
the site starts again there: no gap, no duplicate. A caller that stops and starts again
later passes ``since=watch.positions``; a start the log no longer holds raises
:class:`~lodestream.client.errors.WatchGap` instead of skipping ahead.

Every event is checked with the one shared rule
(:func:`lodestream.schemas.trust.event_from_message`); one that fails it is skipped and
counted in :attr:`Watch.refused`, like every other consumer of the log does.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from nats.aio.client import Client
from nats.aio.msg import Msg

from lodestream.client.credential import MonitorCredential
from lodestream.client.errors import CredentialRevoked, WatchError, WatchGap, WatchNotice
from lodestream.client.watchfeed import HEARTBEAT_S, INACTIVE_S, Restart, SiteFeed, Start
from lodestream.infra.nats.monitor import monitor_inbox_prefix
from lodestream.natsconn import TolerantClient, client_tls, server_urls
from lodestream.schemas.codec import EVENT_CLASSES
from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import DecodeError, SubjectError, Untrusted
from lodestream.schemas.resources import JobSpec
from lodestream.schemas.subjects import check_site
from lodestream.schemas.trust import event_from_message

Since = int | datetime | Literal["now"] | Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Watched:
    """One event as the watch delivered it: its stream sequence, its site, the event."""

    seq: int
    site: str
    event: Event


@dataclass(frozen=True, slots=True)
class Filters:
    """Which events of the watched sites the caller gets; checked before anything starts."""

    types: frozenset[str] | None = None
    jobs: frozenset[uuid.UUID] | None = None
    tags: Mapping[str, str] | None = None

    @classmethod
    def of(
        cls,
        types: Sequence[str] | None,
        jobs: Sequence[str | uuid.UUID] | None,
        tags: Mapping[str, str] | None,
    ) -> Filters:
        if types is not None:
            unknown = sorted(set(types) - set(EVENT_CLASSES))
            if unknown:
                raise WatchError(
                    f"unknown event type(s) {', '.join(map(repr, unknown))}; known types: "
                    + ", ".join(sorted(EVENT_CLASSES))
                )
        ids = None
        if jobs is not None:
            try:
                ids = frozenset(j if isinstance(j, uuid.UUID) else uuid.UUID(j) for j in jobs)
            except ValueError as exc:
                raise WatchError(f"a job id must be a UUID: {exc}") from exc
        return cls(frozenset(types) if types is not None else None, ids, tags)

    def admits(self, event: Event, tagged: set[uuid.UUID]) -> bool:
        if self.types is not None and event.type not in self.types:
            return False
        if self.jobs is not None and event.aggregate_id not in self.jobs:
            return False
        if self.tags is not None:
            # A job's tags are in its spec: job.created's data is the spec itself, and a
            # work item (job.ready and the like) carries it as ``spec``.
            spec = (
                event.data if isinstance(event.data, JobSpec) else getattr(event.data, "spec", None)
            )
            tags = getattr(spec, "tags", None)
            if isinstance(tags, Mapping) and all(tags.get(k) == v for k, v in self.tags.items()):
                tagged.add(event.aggregate_id)  # its later events carry no spec
            return event.aggregate_id in tagged
        return True


class Watch:
    """An async iterator of :class:`Watched`; use :func:`watch` to make one."""

    def __init__(
        self,
        credential: MonitorCredential,
        sites: Sequence[str],
        since: Since,
        filters: Filters,
        *,
        log_end: int | None = None,
        inactive_s: float = INACTIVE_S,
    ) -> None:
        self._inactive_s = inactive_s
        if not sites:
            raise WatchError("no site to watch: name one with sites=[...] (or register a site)")
        try:
            self.sites = tuple(dict.fromkeys(check_site(s) for s in sites))
        except SubjectError as exc:
            raise WatchError(str(exc)) from exc
        self._starts = {site: _start(since, site, log_end) for site in self.sites}
        self._credential = credential
        self._filters = filters
        self._tagged: set[uuid.UUID] = set()
        self._nc: Client | None = None
        self._feeds: list[SiteFeed] = []
        self._ready = asyncio.Event()  # a message arrived for one of the feeds
        # Per site, the first sequence not handed to the caller: a feed receives ahead of it.
        self._cursor = {site: s.seq for site, s in self._starts.items() if s.seq is not None}
        self._errors: list[Exception] = []
        self.refused = 0  # events that failed the shared rule, skipped
        self.resumes = 0  # times a site's feed started again after a break
        self.notices: list[str] = []

    @property
    def positions(self) -> dict[str, int]:
        """Per site, the first sequence not handed out: ``since=`` this to continue exactly.

        Every site watched is in it once the watch is open, those that delivered nothing
        included (at the sequence the watch started from). Before, only the sites started
        at a sequence are."""
        return dict(self._cursor)

    @property
    def behind(self) -> dict[str, int]:
        """Per site, events stored and not yet delivered, as of the last one delivered."""
        return {f.site: f.pending for f in self._feeds}

    async def __aenter__(self) -> Watch:
        if self._nc is not None:  # already open: entered twice, or iterated first
            return self
        try:
            await self._connect()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __aiter__(self) -> AsyncIterator[Watched]:
        return self._events()

    async def close(self) -> None:
        # Taken first: a generator left by `break` is closed later by asyncio, and its close
        # must not cut the connection under this one's consumer deletes.
        nc, self._nc = self._nc, None
        if nc is None:
            return
        try:
            for feed in self._feeds:
                await feed.close()
        finally:
            with contextlib.suppress(Exception):
                await nc.close()

    async def _events(self) -> AsyncIterator[Watched]:
        try:
            if self._nc is None:
                await self._connect()
            while True:
                # Cleared before the feeds are read: a message that arrives while the caller
                # holds an event sets it again, and the next round does not wait.
                self._ready.clear()
                quiet = True
                for feed in self._feeds:
                    for seq, msg in await self._take(feed):
                        quiet = False
                        self._cursor[feed.site] = seq + 1  # handed out (or filtered) now
                        item = self._decode(feed.site, seq, msg)
                        if item is not None and self._filters.admits(item.event, self._tagged):
                            yield item
                if quiet:  # wait on every site at once; the feeds' watchdogs run each second
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._ready.wait(), HEARTBEAT_S)
        finally:
            await self.close()

    async def _take(self, feed: SiteFeed) -> list[tuple[int, Msg]]:
        self._raise_if_refused()
        try:
            return await feed.take()
        except Restart as exc:
            self._raise_if_refused()
            self._notice(f"site {feed.site}: {exc.why}; resuming at sequence {feed.position}")
            self.resumes += 1
            await self._reopen(feed)
            return []

    async def _reopen(self, feed: SiteFeed) -> None:
        assert self._nc is not None
        delay = 0.1
        while True:
            self._raise_if_refused()
            try:
                await feed.restart()
            except WatchError as exc:
                if self._nc.is_closed or isinstance(exc, WatchGap):
                    raise
                self._notice(f"site {feed.site}: {exc}; trying again")
            else:
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _decode(self, site: str, seq: int, msg: Msg) -> Watched | None:
        try:
            event = event_from_message(msg.subject, msg.data)
        except (Untrusted, DecodeError) as exc:
            self.refused += 1
            self._notice(f"site {site}: skipped an event that fails the shared rule: {exc}")
            return None
        return Watched(seq=seq, site=site, event=event)

    def _notice(self, text: str) -> None:
        self.notices.append(text)
        del self.notices[:-100]
        warnings.warn(text, WatchNotice, stacklevel=2)

    def _raise_if_refused(self) -> None:
        raise_if_refused(self._errors)

    async def _connect(self) -> None:
        cred = self._credential
        nc = await connect_monitor(cred, self._errors)
        self._nc = nc
        self._feeds = [
            SiteFeed(
                nc,
                cred.public_key,
                site,
                self._starts[site],
                inactive_s=self._inactive_s,
                errors=self._errors,
                ready=self._ready,
            )
            for site in self.sites
        ]
        for feed in self._feeds:
            await feed.open()
            if feed.position is not None:  # "now" and times, resolved
                self._cursor.setdefault(feed.site, feed.position)


def raise_if_refused(errors: Sequence[Exception]) -> None:
    """Raise :class:`CredentialRevoked` if the server refused the credential in ``errors``."""
    for exc in errors:
        words = str(exc).lower()
        if "authorization violation" in words or "authentication" in words:
            raise CredentialRevoked(
                "nats-server refused the monitoring credential (revoked, or not yet "
                "applied): get a new one with `lode watch --new-credential` or from the API"
            )


async def connect_monitor(credential: MonitorCredential, errors: list[Exception]) -> Client:
    """Connect to NATS with ``credential`` (wss://, its inbox prefix), reconnecting forever.

    What the server reports goes into ``errors`` (the 20 latest); a refused credential
    raises :class:`CredentialRevoked`, any other failure to connect :class:`WatchError`.
    """

    async def record(exc: Exception) -> None:
        errors.append(exc)
        del errors[:-20]

    nc = TolerantClient()
    options: dict[str, Any] = {
        "servers": server_urls(credential.nats_url),
        "nkeys_seed_str": credential.seed,
        "inbox_prefix": monitor_inbox_prefix(credential.public_key),
        "name": "lode-watch",
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.5,
        "error_cb": record,
    }
    tls = client_tls(str(credential.ca_file) if credential.ca_file else None)
    if tls is not None:
        options["tls"] = tls
    with warnings.catch_warnings():
        # nats-py hands aiohttp a float timeout, which aiohttp deprecates.
        warnings.filterwarnings("ignore", "parameter 'timeout'", DeprecationWarning)
        # With endless reconnects nats-py also retries a first connect forever, refused
        # credential or not: the refusal arrives through error_cb, and ends the wait.
        connecting = asyncio.ensure_future(nc.connect(**options))
        try:
            while not connecting.done():
                await asyncio.wait({connecting}, timeout=0.1)
                raise_if_refused(errors)
            connecting.result()
        except BaseException as exc:
            connecting.cancel()
            with contextlib.suppress(BaseException):
                await connecting
            with contextlib.suppress(Exception):
                await nc.close()
            if isinstance(exc, WatchError | asyncio.CancelledError):
                raise
            raise WatchError(f"cannot connect to {credential.nats_url}: {exc}") from exc
    return nc


def _start(since: Since, site: str, log_end: int | None) -> Start:
    if isinstance(since, Mapping):
        if site not in since:
            # Starting it at "now" would skip what it got while the caller was away.
            raise WatchError(
                f"since has no position for site {site!r}: pass one for every site watched "
                "(Watch.positions has them all), e.g. 1 for everything"
            )
        since = since[site]
    if since == "now":
        return Start()
    if isinstance(since, datetime):
        if since.tzinfo is None:
            raise WatchError("since: a time must carry its time zone (e.g. 2026-01-02T03:04Z)")
        return Start(time=since)
    if isinstance(since, bool) or not isinstance(since, int) or since < 1:
        raise WatchError(f"since must be a sequence ≥ 1, a tz-aware time or 'now'; got {since!r}")
    if log_end is not None and since > log_end + 1:
        raise WatchError(
            f"since={since} is beyond the end of the log (its last sequence is {log_end}); "
            f"use since={log_end + 1} or 'now' for what comes next"
        )
    return Start(seq=since)


def watch(
    credential: MonitorCredential,
    sites: Sequence[str],
    *,
    since: Since = "now",
    types: Sequence[str] | None = None,
    jobs: Sequence[str | uuid.UUID] | None = None,
    tags: Mapping[str, str] | None = None,
    log_end: int | None = None,
    inactive_s: float = INACTIVE_S,
) -> Watch:
    """Watch ``sites``' events live; iterate with ``async for``.

    ``since`` is a stream sequence (the first to deliver), a tz-aware time, ``"now"``
    (only what comes next) or a ``{site: sequence}`` mapping with every site of ``sites``
    (:attr:`Watch.positions` of an earlier watch: this one goes on exactly where it
    stopped).
    ``types`` (event types such as ``job.failed``), ``jobs`` (job ids) and ``tags`` (a
    job's tags, matched on the job's events from its creation on) narrow what is
    delivered. ``log_end`` (the log's last sequence, from the API) lets a ``since``
    beyond it be refused at once. ``inactive_s``: how long the server keeps a consumer
    this watch stopped pulling from (a caller that falls further behind is told, in a
    :class:`WatchNotice`, and resumes where it was). Raises :class:`WatchError` for a bad
    argument, :class:`CredentialRevoked` when nats-server refuses the credential and
    :class:`WatchGap` when the log no longer holds a site's start.
    """
    filters = Filters.of(types, jobs, tags)
    return Watch(credential, sites, since, filters, log_end=log_end, inactive_s=inactive_s)


def watch_sync(
    credential: MonitorCredential, sites: Sequence[str], **options: Any
) -> Iterator[Watched]:
    """:func:`watch` for code without an event loop: a blocking iterator.

    The watch runs on a thread of its own; at most a few thousand events wait for the
    caller, after which that thread stops pulling (the server holds nothing meanwhile).
    """
    w = watch(credential, sites, **options)
    items: queue.Queue[Watched | BaseException | None] = queue.Queue(maxsize=4096)
    stop = threading.Event()
    running: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = []

    def hand(item: Watched | BaseException | None) -> bool:
        """Queue ``item`` for the caller; False once the caller has stopped."""
        while not stop.is_set():
            try:
                items.put(item, timeout=0.2)
            except queue.Full:
                continue
            return True
        return False

    async def pump() -> None:
        task = asyncio.current_task()
        assert task is not None
        running.append((asyncio.get_running_loop(), task))
        if stop.is_set():  # the caller left before this thread began
            return
        try:
            async with w:
                async for item in w:
                    if not hand(item):
                        return
        except asyncio.CancelledError:  # the caller left while the watch waited
            return
        except BaseException as exc:  # handed to the caller's thread
            hand(exc)
            return
        hand(None)

    thread = threading.Thread(target=lambda: asyncio.run(pump()), name="lode-watch", daemon=True)
    thread.start()
    try:
        while True:
            got = items.get()
            if got is None:
                return
            if isinstance(got, BaseException):
                raise got
            yield got
    finally:
        # The watch may be waiting for an event that never comes: cancel it, so that it
        # closes its connection and the thread ends now.
        stop.set()
        for loop, task in running:
            with contextlib.suppress(RuntimeError):  # that loop has already ended
                loop.call_soon_threadsafe(task.cancel)
        thread.join(timeout=10)
