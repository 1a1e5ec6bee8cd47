"""A child's release that JetStream did not take is appended again, not acked away (issue 16).

While a cluster elects a new leader for EVENTS, a pipelined publish can be answered "no
responders" (nats-py's ``NoStreamResponseError``) or refused with an API error that is not a
lost compare-and-set. ``EventLog.append_many`` reports such an append as ``Rejected`` with an
``AppendError``. The controller once counted every ``Rejected`` as a lost CAS ("the aggregate
moved on") and acked the parent's ``job.finished``: the child stayed in AWAITING_PARENTS for
ever. Here the real nats-server answers every publish, except the child's release, once.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from nats.aio.client import Client
from nats.js.api import PubAck
from nats.js.errors import APIError, NoStreamResponseError
from nats.js.errors import Error as JetStreamError

from lodestream.eventlog import EventLog
from lodestream.eventlog.jetstream import JetStream
from lodestream.schemas.subjects import EVENTS_STREAM, event_subject
from tests.integration.test_controller import (
    OWNER,
    SITE,
    history,
    run_to_done,
    running_controller,
    until_state,
)
from tests.support.builders import job_created, site_registered
from tests.support.projection import running_projector

# The controller's durable redelivers an unacked message after ack_wait (10 s).
REDELIVERED_WITHIN_S = 40.0


class LeaderElection(JetStream):
    """A JetStream context whose first pipelined publish on ``subject`` gets ``failure``
    instead of reaching the server, as a publish does while EVENTS has no leader."""

    def __init__(self, nc: Client, subject: str, failure: JetStreamError) -> None:
        super().__init__(nc)
        self._subject = subject
        self._failure = failure
        self.failed = 0

    async def publish_async(
        self, subject: str, *args: Any, **kwargs: Any
    ) -> asyncio.Future[PubAck]:
        if subject != self._subject or self.failed:
            return await super().publish_async(subject, *args, **kwargs)
        self.failed += 1
        future: asyncio.Future[PubAck] = asyncio.get_running_loop().create_future()
        future.set_exception(self._failure)
        return future


async def released_despite(failure: JetStreamError, nc: Client, js: JetStream, dsn: str) -> None:
    log = EventLog(js)
    await log.append(site_registered(SITE, OWNER), expect=0)
    parent = job_created(SITE, OWNER)
    # Two children: one release fails, the other lands in the same batch. Deciding the batch
    # again must append the first and recognise the second as already there.
    failing, landing = (job_created(SITE, OWNER, parent_ids=[parent.aggregate_id]) for _ in "ab")
    for event in (parent, failing, landing):
        await log.append(event, expect=0)
    # No app is registered, so a release skips straight to job.preprocessed.
    release = event_subject(SITE, "job.preprocessed", failing.aggregate_id)
    election = LeaderElection(nc, release, failure)
    async with running_projector(js, dsn), running_controller(election, dsn) as controller:
        for child in (failing, landing):
            await until_state(dsn, child.aggregate_id, "AWAITING_PARENTS")
        seq = await until_state(dsn, parent.aggregate_id, "PREPROCESSED")
        await run_to_done(log, parent.aggregate_id, seq)
        await until_state(dsn, parent.aggregate_id, "JOB_FINISHED")
        for child in (failing, landing):
            await until_state(dsn, child.aggregate_id, "PREPROCESSED", REDELIVERED_WITHIN_S)
        assert election.failed == 1
        assert controller.retried >= 1  # the parent's job.finished was left for redelivery
    for child in (failing, landing):
        assert await history(dsn, child.aggregate_id) == [
            "job.created", "job.awaiting_parents", "job.preprocessed",
        ]  # fmt: skip
        assert await releases_of(js, child.aggregate_id) == 1


async def releases_of(js: JetStream, job_id: uuid.UUID) -> int:
    """How many job.preprocessed the log holds for the job (a release must land once)."""
    subject = event_subject(SITE, "job.preprocessed", job_id)
    info = await js.stream_info(EVENTS_STREAM, subjects_filter=subject)
    return int((info.state.subjects or {}).get(subject, 0))


async def test_a_release_answered_no_responders_is_appended_on_redelivery(
    nc: Client, js: JetStream, database_url: str
) -> None:
    await released_despite(NoStreamResponseError(), nc, js, database_url)


async def test_a_release_refused_without_a_leader_is_appended_on_redelivery(
    nc: Client, js: JetStream, database_url: str
) -> None:
    # What a replica answers while the stream has no leader: not a lost CAS (10071).
    no_leader = APIError(
        code=503, err_code=10008, description="JetStream system temporarily unavailable"
    )
    await released_despite(no_leader, nc, js, database_url)
