"""Two pilots share a burst of runnable jobs once each has acked creations it cannot run.

The launch feed carries every ``job.created``; a pilot acks those not created runnable, and
each took up one message of its pull request. Without topping the request up, a pilot's
request is smaller than its room when the runnable burst comes, and the rest of the burst
waits for a later request (at a site, a peer's: in a four-pilot run 4 of 16 slots stood
idle for 0.6 s while full pilots kept the jobs). With ``top_up`` each pilot asks for the
difference at once, so the burst is delivered whole, half to each (a real nats-server; the
server's own count of undelivered messages is the check).
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from lodestream.eventlog import EventLog
from lodestream.eventlog.consumers import ensure_site_consumers
from lodestream.eventlog.pull import PullConsumer, pull_consumer
from lodestream.schemas.events.job import CreatedData, JobCreated
from lodestream.schemas.states import CREATED_RUNNABLE
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.schemas.topology import LAUNCH
from lodestream.schemas.trust import event_from_message
from tests.support.builders import job_created

SITE, OWNER = "alpha", "ada"
ROOM = 4  # each pilot's free slots
WAIT_S = 5.0  # the pull requests' expiry: none ends during the test


def created_runnable() -> JobCreated:
    data = CreatedData(site=SITE, app="demo", workdir="w", skipped=CREATED_RUNNABLE)
    return JobCreated.create(site=SITE, aggregate_id=uuid.uuid4(), actor=f"user:{OWNER}",
                             data=data)  # fmt: skip


def runnable(msg: Msg) -> bool:
    event = event_from_message(msg.subject, msg.data)
    return isinstance(event, JobCreated) and event.runnable


async def settle_noise(pilot: PullConsumer, first: list[Msg]) -> int:
    """What a pilot does with its first deliveries: ack each creation it cannot run."""
    msgs = first + await pilot.fetch(ROOM - len(first), timeout=0.05)  # the rest, queued
    for msg in msgs:
        assert not runnable(msg)
        await msg.ack()
    return len(msgs)


async def undelivered_after_burst(js: JetStreamContext, *, top_up: bool) -> tuple[int, int, int]:
    """Two pilots with room for 4 each; 4 creations not runnable, then 8 runnable. What the
    server has not delivered once the burst is in, and what each pilot then holds."""
    await ensure_site_consumers(js, SITE)
    log = EventLog(js)
    pilots = [await pull_consumer(js, LAUNCH.stream, LAUNCH.durable(SITE), top_up=top_up)
              for _ in range(2)]  # fmt: skip
    fetches = [asyncio.create_task(p.fetch(ROOM, timeout=WAIT_S)) for p in pilots]
    await asyncio.sleep(0.2)  # both requests open before the first message
    for _ in range(4):
        await log.append(job_created(SITE, OWNER), expect=0)
    await asyncio.sleep(0.3)  # all four delivered
    firsts = await asyncio.gather(*fetches)
    noise = [await settle_noise(p, first) for p, first in zip(pilots, firsts, strict=True)]
    assert noise == [2, 2]  # the server shares them out: two of each request taken
    # Each pilot asks again for its room; with top-up, that is a request for the two its
    # first request no longer covers.
    waiting = [asyncio.create_task(p.fetch(ROOM, timeout=WAIT_S)) for p in pilots]
    await asyncio.sleep(0.2)
    for _ in range(2 * ROOM):
        await log.append(created_runnable(), expect=0)
    await asyncio.sleep(0.5)
    info = await js.consumer_info(EVENTS_STREAM, LAUNCH.durable(SITE))
    held = []
    for pilot, first in zip(pilots, waiting, strict=True):
        msgs = await first
        msgs += await pilot.fetch(ROOM - len(msgs), timeout=0.05) if len(msgs) < ROOM else []
        assert all(runnable(m) for m in msgs)
        held.append(len(msgs))
    return int(info.num_pending), held[0], held[1]


@pytest.mark.parametrize(("top_up", "expected"), [(True, (0, 4, 4)), (False, (4, 2, 2))])
async def test_a_burst_after_acked_creations_reaches_the_pilots_whole(
    js: JetStreamContext, top_up: bool, expected: tuple[int, int, int]
) -> None:
    # Without top-up (the control): each request has two left, so four of the burst wait.
    assert await undelivered_after_burst(js, top_up=top_up) == expected


async def test_a_request_that_ends_leaves_the_top_up_open_and_counted(js: JetStreamContext) -> None:
    """The server says how much of a request's batch it did not deliver when the request
    ends; only that is taken off, so a top-up still open is not asked for a second time (a
    pilot that did would fetch more than its room, and keep or hand back the surplus)."""
    await ensure_site_consumers(js, SITE)
    pilot = await pull_consumer(js, LAUNCH.stream, LAUNCH.durable(SITE), top_up=True)
    first = asyncio.create_task(pilot.fetch(ROOM, timeout=0.3))  # ends 0.3 s on
    await asyncio.sleep(0.1)
    await EventLog(js).append(created_runnable(), expect=0)
    assert len(await first) == 1  # three of its four left
    topped = asyncio.create_task(pilot.fetch(ROOM, timeout=WAIT_S))  # tops up by one
    await asyncio.sleep(0.5)  # the first request has ended (408, three pending)
    assert await topped == []  # woken by that end, nothing delivered
    again = asyncio.create_task(pilot.fetch(ROOM, timeout=WAIT_S))
    await asyncio.sleep(0.2)
    info = await js.consumer_info(EVENTS_STREAM, LAUNCH.durable(SITE))
    assert info.num_waiting == 1  # the top-up alone: no new request beside it
    await EventLog(js).append(created_runnable(), expect=0)
    assert len(await again) == 1  # which delivers
