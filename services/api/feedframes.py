"""The push feed's SSE frames, and the cache that builds each event's frame once.

An event's frame is the same for every client that may see it (its ``id`` is its stream
sequence, its ``data`` the event's JSON), so it is decoded, checked with the shared rule
and serialised once per api, whatever the number of clients and filters. The cache keeps
the newest ``FRAME_CACHE_SIZE`` events, and no more than ``FRAME_CACHE_BYTES`` of frames.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Final

import orjson
from nats.aio.msg import Msg

from lodestream.schemas.codec import to_document
from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import Untrusted
from lodestream.schemas.trust import event_from_message
from lodestream.services.api.feedfilter import FeedFilter

log = logging.getLogger(__name__)

RETRY_MS: Final = 1000  # how soon a browser reconnects after a lag or a restart
FRAME_CACHE_SIZE: Final = 8192
FRAME_CACHE_BYTES: Final = 64 * 2**20  # events are as large as a site makes them

OPENING: Final = f"retry: {RETRY_MS}\n: lodestream event feed\n\n".encode()


class FrameCache:
    """The checked event and its SSE frame by stream sequence; one per app (its stream)."""

    def __init__(self, size: int = FRAME_CACHE_SIZE, max_bytes: int = FRAME_CACHE_BYTES) -> None:
        self._size = size
        self._max_bytes = max_bytes
        self._bytes = 0
        self._frames: OrderedDict[int, tuple[Event, bytes] | None] = OrderedDict()
        self.refused = 0

    def get(self, seq: int, subject: str, data: bytes) -> tuple[Event, bytes] | None:
        """The event and its frame; None when the shared rule refuses it (logged, counted)."""
        if seq in self._frames:
            return self._frames[seq]
        try:
            event = event_from_message(subject, data)
        except Untrusted as exc:
            log.warning("push feed: refused %s (seq %d): %s", subject, seq, exc)
            self.refused += 1
            found = None
        else:
            found = (event, event_frame(seq, {"seq": seq, **to_document(event)}))
        self._frames[seq] = found
        self._bytes += _size(found)
        while len(self._frames) > 1 and (
            len(self._frames) > self._size or self._bytes > self._max_bytes
        ):
            self._bytes -= _size(self._frames.popitem(last=False)[1])
        return found


def _size(found: tuple[Event, bytes] | None) -> int:
    return 0 if found is None else len(found[1])


def accepted_frames(
    cache: FrameCache, chosen: FeedFilter, msgs: Sequence[Msg]
) -> tuple[list[tuple[int, bytes]], int | None]:
    """The frames of ``msgs`` that pass the shared rule and ``chosen``, as (seq, frame), and
    the sequence of the last message read (None when there was none)."""
    framed: list[tuple[int, bytes]] = []
    seq: int | None = None
    for msg in msgs:
        seq = int(msg.metadata.sequence.stream)
        found = cache.get(seq, msg.subject, msg.data)
        if found is not None and chosen.accepts(found[0]):
            framed.append((seq, found[1]))
    return framed, seq


def event_frame(seq: int, document: dict[str, object]) -> bytes:
    # orjson writes no line breaks, so the document is one ``data:`` line.
    return b"id: %d\ndata: %s\n\n" % (seq, orjson.dumps(document))


def heartbeat_frame(seen_seq: int) -> bytes:
    # The id lets a reconnecting client skip what its filter refused.
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
