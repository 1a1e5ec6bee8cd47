"""The per-site durables the control plane provides (``lodestream/eventlog/consumers.py``).

A site whose ``launch-<site>`` was made by an older controller, before ``job.created`` was
on that feed, gets the table's filter when a newer controller starts, and keeps its place:
nothing it delivered comes again, and what is new reaches it.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from typing import Any

import nats.errors
import pytest
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from lodestream.eventlog import EventLog
from lodestream.eventlog.consumers import consumer_config, ensure_site_consumers
from lodestream.eventlog.kernel import hand_back
from lodestream.eventlog.pull import NO_CONSUMER_WAIT_S, PullConsumer, fetch_or_pause, pull_consumer
from lodestream.schemas.events.job import CreatedData, JobCreated
from lodestream.schemas.states import CREATED_RUNNABLE
from lodestream.schemas.subjects import EVENTS_STREAM, type_filter
from lodestream.schemas.topology import LAUNCH, XFER
from lodestream.schemas.trust import event_from_message
from tests.support.builders import job_created

SITE, OWNER = "alpha", "ada"


async def test_an_older_launch_filter_is_widened_in_place(js: JetStreamContext) -> None:
    old = consumer_config(LAUNCH, SITE)
    old = replace(old, filter_subjects=[s for s in old.filter_subjects or [] if "created" not in s])
    await js.add_consumer(EVENTS_STREAM, old)
    log = EventLog(js)
    before = job_created(SITE, OWNER)  # on the log before the upgrade: not on the old filter
    await log.append(before, expect=0)

    await ensure_site_consumers(js, SITE)
    await ensure_site_consumers(js, SITE)  # a second start changes nothing

    info = await js.consumer_info(EVENTS_STREAM, LAUNCH.durable(SITE))
    assert sorted(info.config.filter_subjects or []) == sorted(LAUNCH.filter_subjects(SITE))
    assert info.config.ack_wait == LAUNCH.ack_wait_s
    after = JobCreated.create(
        site=SITE, aggregate_id=uuid.uuid4(), actor=f"user:{OWNER}",
        data=CreatedData(site=SITE, app="demo", workdir="w", skipped=CREATED_RUNNABLE),
    )  # fmt: skip
    await log.append(after, expect=0)
    sub = await pull_consumer(js, LAUNCH.stream, LAUNCH.durable(SITE))
    msgs = await sub.fetch(10, timeout=2)
    delivered = [event_from_message(m.subject, m.data).aggregate_id for m in msgs]
    # The consumer had not passed ``before`` yet, so the wider filter delivers it too (a
    # pilot acks it: it is not created runnable).
    assert delivered == [before.aggregate_id, after.aggregate_id]


async def test_a_reader_started_before_its_consumer_exists_reads_once_it_does(
    js: JetStreamContext,
) -> None:
    """A pilot may start as its site is being registered, before the controller made the
    site's consumers. The server answers such a pull request "no responders" at once; the
    reader must say so (the pull loop then waits a moment) and ask again on its next fetch,
    not hold an answered request open until its expiry (a pilot's first job waited ~1.3 s)."""
    sub = await pull_consumer(js, LAUNCH.stream, LAUNCH.durable(SITE))
    with pytest.raises(nats.errors.NoRespondersError):
        await sub.fetch(1, timeout=5)
    # A reader that loops on its own (a rebuild, the API's push feeds) sees nothing yet,
    # after a pause, rather than an error that would end it.
    began = asyncio.get_running_loop().time()
    assert await fetch_or_pause(sub, 1, timeout=5) == []
    assert asyncio.get_running_loop().time() - began >= NO_CONSUMER_WAIT_S * 0.9
    await ensure_site_consumers(js, SITE)
    job = JobCreated.create(
        site=SITE, aggregate_id=uuid.uuid4(), actor=f"user:{OWNER}",
        data=CreatedData(site=SITE, app="demo", workdir="w", skipped=CREATED_RUNNABLE),
    )  # fmt: skip
    await EventLog(js).append(job, expect=0)
    msgs = await sub.fetch(1, timeout=5)  # a new request: the first was answered
    assert [event_from_message(m.subject, m.data).aggregate_id for m in msgs] == [job.aggregate_id]
    await sub.stop()


async def _hold_one(js: JetStreamContext) -> tuple[PullConsumer, Msg, asyncio.Task[Any]]:
    """A reader holding one transfer request, with a pull request of its own still open."""
    await js.publish(type_filter(SITE, "xfer.requested").replace("*", str(uuid.uuid4())), b"{}")
    reader = await pull_consumer(js, XFER.stream, XFER.durable(SITE))
    [held] = await reader.fetch(1, timeout=5)
    still_open = asyncio.create_task(reader.fetch(10, timeout=30))
    await asyncio.sleep(0.2)  # the request reaches the server
    return reader, held, still_open


async def _next_reader_gets(js: JetStreamContext, timeout_s: float) -> list[Msg]:
    successor = await pull_consumer(js, XFER.stream, XFER.durable(SITE))
    try:
        return await successor.fetch(1, timeout=timeout_s)
    finally:
        await successor.stop()


async def test_a_stopping_reader_hands_what_it_holds_to_the_next_at_once(
    js: JetStreamContext,
) -> None:
    """An agent that stops gives its held deliveries back (nak) for the next agent, while a
    pull request of its own may still be open on the server. ``hand_back`` stops the
    subscription first, so the server sends them to the next reader, not into that request."""
    await ensure_site_consumers(js, SITE)
    assert XFER.ack_wait_s >= 60  # what a nak delivered to nobody waits for

    # The order hand_back avoids: the nak reaches the server while the inbox is still
    # subscribed, and the message goes back into the stopping reader's open request.
    reader, lost, still_open = await _hold_one(js)
    await lost.nak()
    await asyncio.sleep(0.3)
    await reader.stop()
    still_open.cancel()
    assert await _next_reader_gets(js, timeout_s=3) == []

    reader, held, still_open = await _hold_one(js)
    try:
        await hand_back(reader, [held], "test")
    finally:
        still_open.cancel()
    again = await _next_reader_gets(js, timeout_s=10)
    assert [m.subject for m in again] == [held.subject]
    assert again[0].metadata.num_delivered == 2
