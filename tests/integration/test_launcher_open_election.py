"""A pilot that opens its session while EVENTS elects a leader keeps it, or opens another.

In the 3-node cluster test (tests/containers/test_cluster_node_loss.py) a pilot's
``session.opened`` was answered "no responders" (nats-py's ``NoStreamResponseError``) four
times; its retry pauses grew past the heartbeat TTL, the server expired its heartbeat, and
the controller appended ``session.expired`` (with no compare-and-set) on the session that
was not opened yet. The next try of ``session.opened`` (expect=0) lost its CAS to that, and
the pilot exited "session refused" with jobs waiting. Here the real nats-server answers
everything except what :class:`OpenDuringElection` fails instead of sending.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js.api import PubAck
from nats.js.errors import NoStreamResponseError, NotFoundError

from lodestream.agents.launcher.main import run as run_launcher
from lodestream.eventlog import EventLog
from lodestream.eventlog.jetstream import JetStream
from lodestream.schemas.subjects import EVENTS_STREAM, event_subject
from tests.fixtures.nats import SecureNats
from tests.integration.test_launcher import (
    control_plane,
    job_event_data,
    started_counts,
    submit,
    until_all,
)
from tests.support.builders import job_created, site_registered
from tests.support.site import secure_site_dir

pytestmark = pytest.mark.slow
SITE, OWNER = "alpha", "ada"
# Enough "no responders" that, without heartbeats between the tries, the pause after the
# last one (6-8 s of the pilot's backoff) is twice the test's heartbeat TTL (3 s).
OPEN_FAILURES = 5


class OpenDuringElection(JetStream):
    """The pilot's JetStream context while EVENTS has no leader: the first session's
    ``session.opened`` is answered "no responders" without reaching the server,
    ``open_failures`` times; with ``heartbeats_lost`` its heartbeats after the first one
    fail too, until the controller has expired that session (HB had no leader either)."""

    def __init__(
        self, nc: Client, *, open_failures: int = 0, heartbeats_lost: bool = False, **options: Any
    ) -> None:
        super().__init__(nc, **options)
        self._open_failures = open_failures
        self._heartbeats_lost = heartbeats_lost
        self.sessions: list[uuid.UUID] = []  # in the order of their first heartbeat
        self.failed_opens = 0
        self.failed_beats = 0
        self._beats = 0
        self._expired = False

    async def publish(self, subject: str, *args: Any, **kwargs: Any) -> PubAck:
        if subject.startswith(f"hb.{SITE}."):
            session = uuid.UUID(subject.rsplit(".", 1)[1])
            if session not in self.sessions:
                self.sessions.append(session)
        if self.sessions and await self._fails(subject, self.sessions[0]):
            raise NoStreamResponseError()
        return await super().publish(subject, *args, **kwargs)

    async def _fails(self, subject: str, first: uuid.UUID) -> bool:
        if subject == event_subject(SITE, "session.opened", first):
            if self.failed_opens < self._open_failures or await self._still_electing(first):
                self.failed_opens += 1
                return True
        elif subject == f"hb.{SITE}.{first}" and self._heartbeats_lost:
            self._beats += 1
            # The first beat lands, so that the server has a heartbeat of ours to expire.
            if self._beats > 1 and await self._still_electing(first):
                self.failed_beats += 1
                return True
        return False

    async def _still_electing(self, session: uuid.UUID) -> bool:
        """With heartbeats lost: until the log holds the controller's session.expired."""
        if not self._heartbeats_lost or self._expired:
            return False
        try:
            await self.get_msg(
                EVENTS_STREAM, subject=event_subject(SITE, "session.expired", session), direct=True
            )
        except NotFoundError:
            return True
        self._expired = True
        return False


async def run_one_job(
    secure_nats: SecureNats,
    dsn: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    **election_options: Any,
) -> tuple[OpenDuringElection, uuid.UUID]:
    """Run a pilot through an election until one job finished: the election, the job's id."""
    site = secure_site_dir(secure_nats, tmp_path)
    elections: list[OpenDuringElection] = []

    def through_election(nc: Client, **options: Any) -> JetStream:
        elections.append(OpenDuringElection(nc, **election_options, **options))
        return elections[-1]

    monkeypatch.setattr("lodestream.agents.launcher.main.jetstream", through_election)
    async with control_plane(secure_nats, dsn) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        [job] = await submit(js, [job_created(SITE, OWNER, app="hello", workdir="elected")])
        await until_all(dsn, [job], "PREPROCESSED")
        stop = asyncio.Event()
        pilot = asyncio.create_task(run_launcher(site.directory, wall_time_min=10, stop=stop))
        done = asyncio.create_task(until_all(dsn, [job], "JOB_FINISHED", timeout_s=90))
        # A pilot that gives up must fail the test at once, not after the wait.
        await asyncio.wait([pilot, done], return_when=asyncio.FIRST_COMPLETED)
        if pilot.done():
            done.cancel()
            pytest.fail(f"the pilot exited before running the job: {pilot.result()}")
        await done
        stop.set()
        report = await asyncio.wait_for(pilot, 30)
    assert report.exit_reason == "stopped"
    assert (report.started, report.finished) == (1, 1)
    assert await started_counts(dsn, [job]) == {job: 1}
    [election] = elections
    return election, job


async def test_a_session_opened_through_no_responders_for_longer_than_the_ttl_is_kept(
    secure_nats: SecureNats, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    election, job = await run_one_job(
        secure_nats, database_url, tmp_path, monkeypatch, open_failures=OPEN_FAILURES
    )
    assert election.failed_opens == OPEN_FAILURES
    # Heartbeats went on while the open was retried: the first session was never expired.
    [session] = election.sessions
    started = await job_event_data(database_url, job, "job.started")
    assert started["session_id"] == str(session)


async def test_a_session_expired_before_it_opened_is_replaced_by_a_new_one(
    secure_nats: SecureNats, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    election, job = await run_one_job(
        secure_nats, database_url, tmp_path, monkeypatch, open_failures=1, heartbeats_lost=True
    )
    assert election.failed_beats >= 1
    expired, opened = election.sessions
    started = await job_event_data(database_url, job, "job.started")
    assert started["session_id"] == str(opened)
    assert expired != opened
