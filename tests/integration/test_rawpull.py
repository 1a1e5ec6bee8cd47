"""RawPull on a durable AckAll consumer, as the live projector reads EVENTS, against nats-server.

What the analytics' replay needs of it (no acks) is tested in test_analytics_stream.py. Here:
an ack reaches the server and covers the batch and nothing read ahead of it; a batch left
unacked comes again after ``ack_wait``; a reader started again on a re-created consumer
hands out nothing its old inbox held; a subject that is not UTF-8 is read as nats-py's
tolerant client reads it; and a delivery that is no message of the stream is refused once,
not on every fetch after it.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from lodestream import natsprivate
from lodestream.eventlog.errors import ReadError
from lodestream.eventlog.rawpull import Delivery, RawPull
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.services.projector.consumer import position_consumer

DURABLE = "reader"


async def store(js: JetStreamContext, count: int) -> None:
    for i in range(count):  # each with the header every stored event carries
        subject = f"evt.alpha.job.{uuid.uuid4()}.created"
        await js.publish(subject, b"%d" % i, headers={"Nats-Msg-Id": str(uuid.uuid4())})


async def durable(js: JetStreamContext, *, ack_wait: float = 30.0, start_seq: int = 1) -> None:
    """The durable exactly as the projector positions it (AckAll, from ``start_seq``)."""
    await position_consumer(js, EVENTS_STREAM, DURABLE, 500, start_seq, ack_wait_s=ack_wait)


async def fetch_until(pull: RawPull, batch: int, count: int) -> list[Delivery]:
    """Fetch batches of ``batch`` until ``count`` deliveries came (a batch is what has
    arrived when the first one did, so it may be short)."""
    got: list[Delivery] = []
    async with asyncio.timeout(20):
        while len(got) < count:
            got += await pull.fetch(batch, 0.5)
    return got


async def ack_floor(js: JetStreamContext, seq: int) -> tuple[int, int]:
    """The durable's ack floor (stream sequence) and its count of pending acks, once the
    floor has reached ``seq``: an ack is a plain publish the server takes in its own time."""
    async with asyncio.timeout(10):
        while True:
            info = await js.consumer_info(EVENTS_STREAM, DURABLE)
            if info.ack_floor is not None and (info.ack_floor.stream_seq or 0) >= seq:
                return info.ack_floor.stream_seq or 0, info.num_ack_pending or 0
            await asyncio.sleep(0.02)


async def test_an_ack_moves_the_ack_floor_to_its_delivery_and_not_past_it(
    js: JetStreamContext,
) -> None:
    await store(js, 12)
    await durable(js)
    pull = await RawPull.on(js, EVENTS_STREAM, DURABLE).start()
    try:
        batch = await fetch_until(pull, 4, 4)
        assert [d.seq for d in batch] == [1, 2, 3, 4]
        later = await fetch_until(pull, 4, 4)
        assert [d.seq for d in later] == [5, 6, 7, 8]
        await pull.ack(batch[-1])
        # AckAll: the first batch, not the one delivered after it.
        assert await ack_floor(js, 4) == (4, 4)
        rest = await fetch_until(pull, 4, 4)
        assert [d.seq for d in rest] == [9, 10, 11, 12]
        await pull.ack(rest[-1])
        assert await ack_floor(js, 12) == (12, 0)
    finally:
        await pull.stop()


async def test_a_batch_left_unacked_is_delivered_again(js: JetStreamContext) -> None:
    await store(js, 6)
    await durable(js, ack_wait=1.0)
    pull = await RawPull.on(js, EVENTS_STREAM, DURABLE).start()
    try:
        first = await fetch_until(pull, 3, 6)
        assert [d.seq for d in first] == [1, 2, 3, 4, 5, 6]
        # Nothing acked: after ack_wait the server sends all of it again, in an order of its
        # own (the projector skips what it applied and repositions on anything else).
        again = await fetch_until(pull, 3, 6)
        assert sorted((d.seq, d.data) for d in again) == [(d.seq, d.data) for d in first]
        await pull.ack(max(again, key=lambda d: d.seq))
        assert await ack_floor(js, 6) == (6, 0)
    finally:
        await pull.stop()


async def test_started_again_on_a_recreated_consumer_it_hands_out_only_what_that_sends(
    nc: Client, js: JetStreamContext
) -> None:
    await store(js, 2)
    await durable(js)
    pull = await RawPull.on(js, EVENTS_STREAM, DURABLE).start()
    try:
        # A request for 4 with 2 stored: it stays open, and what comes for it next...
        assert [d.seq for d in await fetch_until(pull, 4, 2)] == [1, 2]
        await store(js, 8)
        async with asyncio.timeout(10):
            while (await js.consumer_info(EVENTS_STREAM, DURABLE)).delivered.stream_seq < 4:
                await asyncio.sleep(0.02)
        await nc.flush()
        # ...(3 and 4) is held by the reader, unread, when the consumer is re-created further
        # on, as the projector repositions it.
        await pull.stop()
        await durable(js, start_seq=7)
        await pull.start()
        assert [d.seq for d in await fetch_until(pull, 4, 4)] == [7, 8, 9, 10]
    finally:
        await pull.stop()


async def test_a_delivery_that_is_no_stream_message_is_refused_once(
    nc: Client, js: JetStreamContext
) -> None:
    await store(js, 1)
    await durable(js)
    pull = await RawPull.on(js, EVENTS_STREAM, DURABLE).start()
    try:
        assert [d.seq for d in await fetch_until(pull, 1, 1)] == [1]
        # Its inbox (no public way to it): anyone who knows it can publish there.
        await nc.publish(pull._inbox, b"stray", reply="not.an.ack")
        await nc.flush()
        with pytest.raises(ReadError, match="not a JetStream delivery"):
            await pull.fetch(1, 0.5)
        await store(js, 1)
        assert [d.seq for d in await fetch_until(pull, 1, 1)] == [2]
    finally:
        await pull.stop()


async def test_a_subject_that_is_not_utf8_is_read_with_replacement_characters(
    nc: Client, js: JetStreamContext
) -> None:
    # nats-py only sends str subjects; a site can write the protocol line itself, and the
    # server stores it on the site's subjects (tests/security/test_malformed_bytes.py).
    transport = natsprivate.transport_of(nc)
    assert transport is not None
    transport.write(b"PUB evt.alpha.job.\xff\xfe.created 2\r\n{}\r\n")
    await transport.drain()
    await store(js, 1)
    await durable(js)
    pull = await RawPull.on(js, EVENTS_STREAM, DURABLE).start()
    try:
        got = await fetch_until(pull, 2, 2)
    finally:
        await pull.stop()
    assert [(d.seq, d.subject, d.data) for d in got[:1]] == [
        (1, "evt.alpha.job.\ufffd\ufffd.created", b"{}")
    ]
    assert got[1].seq == 2
