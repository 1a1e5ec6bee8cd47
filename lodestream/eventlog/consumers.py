"""The per-site durable consumers, created by the control plane (sites never create consumers).

One per pull row of :data:`lodestream.schemas.topology.SITE_FEEDS`, which says what each
carries and how it is configured; this module only talks to JetStream.
"""

from __future__ import annotations

import contextlib

from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from lodestream.schemas.topology import SITE_CONSUMERS, PullFeed


def consumer_config(feed: PullFeed, site: str) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=feed.durable(site),
        description=f"{feed.description} (site {site})",
        filter_subjects=list(feed.filter_subjects(site)),
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        ack_wait=feed.ack_wait_s,
        max_ack_pending=feed.max_ack_pending,
        max_waiting=feed.max_waiting,
    )


async def ensure_site_consumers(js: JetStreamContext, site: str) -> None:
    # Created once; afterwards updated only when its filter is not the table's (a newer control
    # plane may hand a feed more types, as job.created came to launch-<site>). The server
    # updates a durable in place, keeping its position and pending acks, so the site's
    # pilots may go on reading it meanwhile.
    for feed in SITE_CONSUMERS:
        config = consumer_config(feed, site)
        try:
            info = await js.consumer_info(feed.stream, feed.durable(site))
        except NotFoundError:
            await js.add_consumer(feed.stream, config)
            continue
        if sorted(info.config.filter_subjects or []) != sorted(config.filter_subjects or []):
            await js.add_consumer(feed.stream, config)


async def remove_site_consumers(js: JetStreamContext, site: str) -> None:
    for feed in SITE_CONSUMERS:
        with contextlib.suppress(NotFoundError):
            await js.delete_consumer(feed.stream, feed.durable(site))
