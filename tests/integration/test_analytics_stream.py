"""The analytics' reader of ``EVENTS`` against nats-server: what it reads is what was stored.

:class:`~lodestream.eventlog.rawpull.RawPull` takes its deliveries as bytes, past nats-py's
message building; here its sequences and pending counts are nats-py's own, the connection's
other subscriptions still get whole messages (headers included), a pull request that ends
with nothing is only an empty batch, a reader of some subjects still knows where the
consumer is, a consumer deleted under the reader is an error (not a wait for ever), and a
replay through it folds the log exactly as the messages fold in memory, refused ones
counted the same.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from lodestream.client.analytics.intake import Raw
from lodestream.client.analytics.load import load_stream
from lodestream.client.analytics.selection import Selection
from lodestream.client.analytics.stream import consumer_config
from lodestream.client.analytics.summary import summarize
from lodestream.eventlog.errors import ReadError
from lodestream.eventlog.pull import PullConsumer
from lodestream.eventlog.rawpull import Delivery, Position, RawPull
from lodestream.schemas.subjects import EVENTS_STREAM
from tests.support.analytics import hand_log

JOB = "0190a000-0000-7000-8000-000000000000"


async def store(js: JetStreamContext, raws: list[Raw]) -> None:
    for raw in raws:  # each with the header every stored event carries
        await js.publish(raw.subject, raw.data, headers={"Nats-Msg-Id": str(uuid.uuid4())})


async def new_consumer(js: JetStreamContext) -> str:
    config = consumer_config(Selection())
    assert config.name is not None
    await js.add_consumer(EVENTS_STREAM, config)
    return config.name


async def test_a_replay_of_the_stream_folds_as_the_messages_do(
    nc: Client, js: JetStreamContext
) -> None:
    log = hand_log()
    raws = log.raws()
    n = len(raws)
    garbled = Raw(n + 1, f"evt.alpha.job.{JOB}.finished", b"{oops")
    # A whole event of one site stored on another site's subject: the shared rule refuses it.
    forged = Raw(n + 2, raws[0].subject.replace(".alpha.", ".beta.", 1), raws[0].data)
    await store(js, [*raws, garbled, forged])

    streamed = await load_stream(nc, Selection())
    direct = log.loaded(extra=[garbled, forged])

    assert streamed.timelines == direct.timelines
    assert streamed.intake == direct.intake
    assert (streamed.intake.read, streamed.intake.refused) == (n + 2, 2)
    assert summarize(streamed) == summarize(direct)


async def test_deliveries_carry_what_nats_py_reads_from_them(
    nc: Client, js: JetStreamContext
) -> None:
    await store(js, hand_log().raws()[:5])
    raw = await RawPull(nc, EVENTS_STREAM, await new_consumer(js)).start()
    plain = await PullConsumer.on(js, EVENTS_STREAM, await new_consumer(js)).start()
    try:
        got = await raw.fetch(10, 2.0)
        msgs = await plain.fetch(10, 2.0)
    finally:
        await raw.stop()
        await plain.stop()
    assert [(d.seq, d.pending, d.subject, d.data) for d in got] == [
        (m.metadata.sequence.stream, m.metadata.num_pending, m.subject, m.data) for m in msgs
    ]
    assert [d.seq for d in got] == [1, 2, 3, 4, 5]


async def test_an_empty_pull_is_an_empty_batch_and_the_next_one_reads_on(
    nc: Client, js: JetStreamContext
) -> None:
    raws = hand_log().raws()
    await store(js, raws[:1])
    consumer = await RawPull(nc, EVENTS_STREAM, await new_consumer(js)).start()
    try:
        assert [d.seq for d in await consumer.fetch(10, 0.5)] == [1]
        # The request for 10 ends with a status message when it expires, not with a message.
        assert await consumer.fetch(10, 0.5) == []
        await store(js, raws[1:2])
        assert [d.seq for d in await consumer.fetch(10, 2.0)] == [2]
    finally:
        await consumer.stop()


async def test_a_reader_of_some_subjects_still_knows_where_the_consumer_is(
    nc: Client, js: JetStreamContext
) -> None:
    raws = hand_log().raws()[:6]  # a batch job's four events, a session's, a job's
    await store(js, raws)
    name = await new_consumer(js)
    consumer = await RawPull(nc, EVENTS_STREAM, name, keep=lambda s: b".batch." in s).start()
    got: list[Delivery] = []
    try:
        while consumer.position is None or consumer.position.seq < len(raws):
            got += await consumer.fetch(10, 2.0)
    finally:
        await consumer.stop()
    assert [(d.seq, d.subject) for d in got] == [(r.seq, r.subject) for r in raws[:4]]
    # The last two were left out, unparsed, yet the consumer is known to be past them.
    assert consumer.position == Position(6, 0)


async def until_failed(consumer: RawPull) -> None:
    for _ in range(20):  # the open request expires; the next one finds no consumer
        await consumer.fetch(10, 0.5)


async def test_a_consumer_deleted_under_the_reader_is_an_error(
    nc: Client, js: JetStreamContext
) -> None:
    await store(js, hand_log().raws()[:1])
    name = await new_consumer(js)
    consumer = await RawPull(nc, EVENTS_STREAM, name).start()
    try:
        assert [d.seq for d in await consumer.fetch(10, 0.5)] == [1]
        await js.delete_consumer(EVENTS_STREAM, name)
        with pytest.raises(ReadError, match=r"no consumer answers .*\(503\)"):
            await until_failed(consumer)
    finally:
        await consumer.stop()


async def test_the_other_subscriptions_of_the_connection_get_whole_messages(
    nc: Client, js: JetStreamContext
) -> None:
    got: asyncio.Queue[Msg] = asyncio.Queue()

    async def keep(msg: Msg) -> None:
        await got.put(msg)

    other = await nc.subscribe("elsewhere", cb=keep)
    consumer = await RawPull(nc, EVENTS_STREAM, await new_consumer(js)).start()
    try:
        await nc.publish("elsewhere", b"hello", headers={"Who": "me"})
        msg = await asyncio.wait_for(got.get(), 5.0)
        assert (msg.data, msg.headers) == (b"hello", {"Who": "me"})
    finally:
        await consumer.stop()
    assert "_process_msg" not in vars(nc)  # the connection's own delivery, as it was
    await nc.publish("elsewhere", b"again")
    assert (await asyncio.wait_for(got.get(), 5.0)).data == b"again"
    await other.unsubscribe()
