"""The per-site durables the control plane provides (``lodestream/eventlog/consumers.py``).

A site whose ``launch-<site>`` was made by an older controller, before ``job.created`` was
on that feed, gets the table's filter when a newer controller starts, and keeps its place:
nothing it delivered comes again, and what is new reaches it.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from nats.js import JetStreamContext

from lodestream.eventlog import EventLog
from lodestream.eventlog.consumers import consumer_config, ensure_site_consumers
from lodestream.eventlog.pull import pull_consumer
from lodestream.schemas.events.job import CreatedData, JobCreated
from lodestream.schemas.states import CREATED_RUNNABLE
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.schemas.topology import LAUNCH
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
