"""The leaf site's forwarder checks what it finds in OUTBOX with the shared rule.

Anything on the site's own server may have been written by whoever holds the site: a
garbled payload, an event signed as another site, a garbled compare-and-set header. Each
is dropped, counted and logged; the kept event behind them still reaches the hub.
One nats-server plays both the leaf (OUTBOX) and the hub (EVENTS); their subjects differ.
"""

from __future__ import annotations

import asyncio

from nats.js import JetStreamContext

from lodestream.agents.site.forward import Forwarder
from lodestream.eventlog import EventLog
from lodestream.eventlog.outbox import (
    H_EXPECT,
    OUTBOX_STREAM,
    Outbox,
    ensure_outbox,
    outbox_subject,
)
from lodestream.schemas.codec import encode
from lodestream.schemas.events import JobPreprocessed
from lodestream.schemas.events.job import StepData
from lodestream.schemas.resources import JobSpec
from lodestream.schemas.subjects import EVENTS_STREAM
from tests.support.builders import job_created, site_registered

SITE, OWNER = "alpha", "ada"


async def test_garbled_and_forged_outbox_entries_are_dropped_and_the_rest_forwarded(
    js: JetStreamContext,
) -> None:
    log = EventLog(js)
    await log.append(site_registered(SITE, OWNER), expect=0)
    created = job_created(SITE, OWNER, app="hello")
    seq = (await log.append(created, expect=0)).seq
    await ensure_outbox(js, SITE)
    spec = JobSpec.model_validate({"site": SITE, "app": "hello", "workdir": "w"})
    real = JobPreprocessed.create(
        site=SITE, aggregate_id=created.aggregate_id, actor="controller:main",
        data=StepData(work=spec),
    )  # fmt: skip
    forged = JobPreprocessed.create(
        site=SITE, aggregate_id=created.aggregate_id, actor="site:beta", data=StepData(work=spec)
    )
    bad_header = JobPreprocessed.create(
        site=SITE, aggregate_id=created.aggregate_id, actor=f"site:{SITE}", data=StepData(work=spec)
    )
    await js.publish(outbox_subject(real.subject), b"\x00\xff not an event", stream=OUTBOX_STREAM)
    await js.publish(outbox_subject(forged.subject), encode(forged), stream=OUTBOX_STREAM)
    await js.publish(outbox_subject(bad_header.subject), encode(bad_header),
                     stream=OUTBOX_STREAM, headers={H_EXPECT: "not a number"})  # fmt: skip
    kept = JobPreprocessed.create(
        site=SITE, aggregate_id=created.aggregate_id, actor=f"site:{SITE}", data=StepData(work=spec)
    )
    await Outbox(js).keep(kept, seq)
    forwarder = Forwarder(js, js, SITE)
    stop = asyncio.Event()
    task = asyncio.create_task(forwarder.run(stop))
    try:
        async with asyncio.timeout(30):
            while forwarder.report.forwarded + forwarder.report.refused < 1:
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert forwarder.report.untrusted == 3
    assert (forwarder.report.forwarded, forwarder.report.refused) == (1, 0)
    stored = await js.get_msg(
        EVENTS_STREAM, seq=(await js.stream_info(EVENTS_STREAM)).state.last_seq
    )
    assert stored.subject == kept.subject
    assert (await js.stream_info(OUTBOX_STREAM)).state.messages == 0
