"""The per-site durable consumers, created by the control plane (sites never create consumers).

Each filters the site's own subjects to the events that hand it work:

    launch-<site>   runnable jobs for pilots
    process-<site>  hook work for the site agent (preprocess, postprocess, errors, timeouts)
                    and finished jobs for the cleaner
    sched-<site>    pilot batch-job requests and deletions, for the site agent's scheduler
                    module; a request stays unacknowledged while its batch job lives
"""

from __future__ import annotations

import contextlib

from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from lodestream.schemas.subjects import EVENTS_STREAM, check_site

LAUNCH_EVENTS = ("preprocessed", "restart_ready", "lease_released", "lease_expired")
PROCESS_EVENTS = ("staged_in", "run_done", "run_errored", "run_timed_out", "finished")
SCHED_EVENTS = ("requested", "deletion_requested")


def site_consumer_configs(site: str) -> list[ConsumerConfig]:
    check_site(site)
    return [
        ConsumerConfig(
            durable_name=f"launch-{site}",
            description=f"runnable jobs of site {site}",
            filter_subjects=[f"evt.{site}.job.*.{name}" for name in LAUNCH_EVENTS],
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=30.0,
            max_ack_pending=20_000,
            max_waiting=512,
        ),
        ConsumerConfig(
            durable_name=f"process-{site}",
            description=f"hook work of site {site}",
            filter_subjects=[f"evt.{site}.job.*.{name}" for name in PROCESS_EVENTS],
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=60.0,
            max_ack_pending=20_000,
            max_waiting=512,
        ),
        ConsumerConfig(
            durable_name=f"sched-{site}",
            description=f"pilot batch jobs of site {site}",
            filter_subjects=[f"evt.{site}.batch.*.{name}" for name in SCHED_EVENTS],
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            # Held (in progress at every sync) while the batch job lives; an agent that died
            # has its batch jobs handed to the next one after this long.
            ack_wait=120.0,
            max_ack_pending=10_000,
            max_waiting=64,
        ),
    ]


async def ensure_site_consumers(js: JetStreamContext, site: str) -> None:
    for config in site_consumer_configs(site):
        assert config.durable_name is not None
        try:
            await js.consumer_info(EVENTS_STREAM, config.durable_name)
        except NotFoundError:
            await js.add_consumer(EVENTS_STREAM, config)


async def remove_site_consumers(js: JetStreamContext, site: str) -> None:
    for config in site_consumer_configs(site):
        assert config.durable_name is not None
        with contextlib.suppress(NotFoundError):
            await js.delete_consumer(EVENTS_STREAM, config.durable_name)
