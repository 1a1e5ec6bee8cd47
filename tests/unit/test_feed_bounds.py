"""The push feed's bounds that need no server: an outbox's room, in events and in bytes,
the per-user count of open streams, and the frame cache's bytes."""

from __future__ import annotations

import pytest

from lodestream.schemas.codec import encode
from lodestream.schemas.events.app import AppRegistered
from lodestream.schemas.ids import uuid7
from lodestream.schemas.resources import App
from lodestream.services.api.errors import TooMany
from lodestream.services.api.feedbox import Outbox
from lodestream.services.api.feedframes import FrameCache
from lodestream.services.api.feedslots import StreamSlots


def test_an_outbox_has_no_room_at_either_bound() -> None:
    by_events = Outbox(limit=4, limit_bytes=1 << 20)
    by_events.put(b"x" * 40, 4, 4)
    assert by_events.room == 0
    by_bytes = Outbox(limit=1000, limit_bytes=4096)
    by_bytes.put(b"x" * 4096, 2, 2)
    assert by_bytes.room == 0


def test_an_outbox_asks_for_no_more_than_its_bytes_left_hold() -> None:
    box = Outbox(limit=1000, limit_bytes=10_000)
    assert box.room == 1000  # nothing seen yet: the event bound alone
    box.put(b"x" * 2000, 1, 1)  # frames of 2,000 bytes
    assert box.room == 4  # 8,000 bytes left
    box.put(b"x" * 7000, 4, 5)
    assert box.room == 1, "always room for one, below the bounds"


async def test_taking_what_is_queued_empties_both_counts() -> None:
    box = Outbox(limit=10, limit_bytes=100)
    box.put(b"a" * 60, 3, 3)
    box.put(b"b" * 60, 3, 6)
    assert box.room == 0
    chunk, newest = await box.take()
    assert (len(chunk), newest) == (120, 6)
    assert (box.events, box.bytes) == (0, 0)


def test_streams_past_the_limit_are_refused_and_a_freed_slot_makes_room() -> None:
    slots = StreamSlots()
    frees = [slots.take("ada", 2) for _ in range(2)]
    with pytest.raises(TooMany, match="'ada' already has 2") as refused:
        slots.take("ada", 2)
    assert refused.value.details == {"open": 2, "limit": 2}
    slots.take("bob", 2)  # another user's count is their own
    frees[0]()
    frees[0]()  # freeing twice frees once
    assert slots.held("ada") == 1
    slots.take("ada", 2)
    assert slots.held("ada") == 2


def test_the_frame_cache_keeps_no_more_bytes_than_its_bound() -> None:
    cache = FrameCache(size=1000, max_bytes=3000)
    app = App(site="alpha", name="sim", description="x" * 900)
    for seq in range(1, 11):
        event = AppRegistered.create(
            site="alpha", aggregate_id=uuid7(), actor="site:alpha", data=app
        )
        assert cache.get(seq, f"evt.alpha.app.{event.aggregate_id}.registered", encode(event))
    assert 1 <= len(cache._frames) <= 3
    assert max(cache._frames) == 10, "the newest stay"
