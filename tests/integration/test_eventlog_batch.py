"""``EventLog.append_batch`` (``JetStream.publish_batch``) against a real nats-server: the
same outcomes as ``append_many`` (appended in order, conflicts, a retry that already
landed), the bytes on the log are the bytes measured, and what cannot go out is refused
before anything is sent (issue 15)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from nats.aio.client import Client
from nats.errors import ConnectionClosedError, MaxPayloadError

from lodestream.eventlog import Appended, ConflictError, EventLog, Rejected, jetstream
from lodestream.eventlog.jetstream import BATCH_CHUNK, JetStream
from lodestream.eventlog.wire import H_MSG_ID, Outgoing, headers_for
from lodestream.schemas.codec import encode
from lodestream.schemas.envelope import Event
from lodestream.schemas.subjects import EVENTS_STREAM
from tests.support.builders import job_created

SITE, OWNER = "alpha", "ada"


def created(count: int, **spec: Any) -> list[Outgoing]:
    return [Outgoing.of(job_created(SITE, OWNER, **spec), 0) for _ in range(count)]


async def last_seq(js: JetStream) -> int:
    return int((await js.stream_info(EVENTS_STREAM)).state.last_seq)


def seqs(results: list[Appended | Rejected]) -> list[int]:
    assert all(isinstance(r, Appended) for r in results), results
    return [r.seq for r in results if isinstance(r, Appended)]


async def test_a_batch_larger_than_a_chunk_is_appended_in_order_as_measured(
    js: JetStream,
) -> None:
    messages = created(2 * BATCH_CHUNK + 7)
    results = await EventLog(js).append_batch(messages)
    assert [r.event for r in results] == [m.event for m in messages]
    assert seqs(results) == list(range(1, len(messages) + 1))
    assert not any(isinstance(r, Appended) and r.duplicate for r in results)
    for message in (messages[0], messages[BATCH_CHUNK], messages[-1]):
        stored = await js.get_msg(EVENTS_STREAM, subject=message.subject, direct=True)
        assert stored.data == message.payload == encode(message.event)
        sent = headers_for(message.event, 0)
        assert {k: v for k, v in (stored.headers or {}).items() if k in sent} == sent
    assert js._publish_async_futures == {}  # every slot given back


async def test_outcomes_are_append_manys_conflicts_and_retries_included(js: JetStream) -> None:
    log = EventLog(js)
    first = created(3)
    await log.append_batch(first)
    # A retry of the same events (their Nats-Msg-Id landed) and a new event for an
    # existing job (somebody else's job.created): a duplicate, and a lost compare-and-set.
    landed = first[1].event
    clash = job_created(SITE, OWNER).model_copy(update={"aggregate_id": landed.aggregate_id})
    items: list[tuple[Event, int | None]] = [(first[0].event, 0), (clash, 0), (first[2].event, 0)]
    fresh = created(1)[0]
    items.append((fresh.event, 0))
    batch = await log.append_batch([Outgoing.of(e, x) for e, x in items])
    retry, lost, again, new = batch
    assert isinstance(retry, Appended)
    assert retry.duplicate
    assert retry.seq == 1
    assert isinstance(lost, Rejected)
    assert isinstance(lost.error, ConflictError)
    assert isinstance(again, Appended)
    assert (again.seq, again.duplicate) == (3, True)
    assert isinstance(new, Appended)
    assert (new.seq, new.duplicate) == (4, False)
    # append_many, asked the same (the fresh job now exists: a duplicate too), says the same.
    many = await log.append_many(items)
    assert [(type(r), getattr(r, "seq", None)) for r in many] == [
        (type(r), getattr(r, "seq", None)) for r in batch
    ]


async def test_a_pending_limit_below_the_batch_is_waited_on_not_deadlocked(
    js: JetStream, nc: Client
) -> None:
    small = jetstream(nc, publish_async_max_pending=7)  # js has made the streams
    messages = created(60)
    results = await asyncio.wait_for(EventLog(small).append_batch(messages), timeout=20)
    assert seqs(results) == list(range(1, 61))
    assert small._publish_async_futures == {}
    assert small._publish_async_pending_semaphore._value == 7  # every slot given back


async def test_a_message_over_max_payload_refuses_the_batch_before_sending(
    js: JetStream, nc: Client
) -> None:
    messages = created(3)
    big = created(1, data={"pad": "x" * nc.max_payload})
    with pytest.raises(MaxPayloadError):
        await EventLog(js).append_batch([*messages, *big])
    assert await last_seq(js) == 0
    assert js._publish_async_futures == {}


async def test_a_closed_connection_refuses_the_batch(js: JetStream, nc: Client) -> None:
    await nc.close()
    with pytest.raises(ConnectionClosedError):
        await EventLog(js).append_batch(created(2))


async def test_the_stored_message_id_is_the_events(js: JetStream) -> None:
    (message,) = created(1)
    (result,) = await EventLog(js).append_batch([message])
    stored = await js.get_msg(EVENTS_STREAM, subject=message.subject, direct=True)
    assert isinstance(result, Appended)
    assert stored.seq == result.seq
    assert (stored.headers or {}).get(H_MSG_ID) == str(message.event.id)
