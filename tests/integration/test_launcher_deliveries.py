"""What reaches a pilot on ``launch-<site>`` that is not simply work: duplicates and forgeries.

No delivery stops a pilot. Two runnable deliveries of one job run it once; what the
shared rule refuses (garbage, another site's work, a forged signature), even when the
site's own key published it, is terminated, logged and counted.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from lodestream.agents.launcher import running as running_module
from lodestream.agents.launcher.main import run as run_launcher
from lodestream.agents.launcher.reads import created_spec
from lodestream.agents.launcher.running import MISSING_CREATED_DELIVERIES
from lodestream.eventlog import EventLog, jetstream
from lodestream.schemas.codec import encode
from lodestream.schemas.events import JobKilled, JobPreprocessed, JobReset
from lodestream.schemas.events.job import StepData
from lodestream.schemas.resources import JobSpec
from tests.fixtures.nats import SecureNats, connect_site
from tests.integration.test_launcher import control_plane, started_counts, submit, until_all
from tests.support.builders import job_created, site_registered
from tests.support.site import secure_site_dir

SITE, OWNER = "alpha", "ada"


async def last_seq(dsn: str, job_id: uuid.UUID) -> int:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute("SELECT last_seq FROM rm.jobs WHERE id = %s", (job_id,))
        (seq,) = await cursor.fetchone() or (0,)
        return int(seq)


async def test_two_runnable_deliveries_of_one_job_run_it_once(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    site = secure_site_dir(secure_nats, tmp_path, idle_ttl_s=60)
    async with control_plane(secure_nats, database_url) as js:
        log = EventLog(js)
        await log.append(site_registered(SITE, OWNER), expect=0)
        [job] = await submit(js, [job_created(SITE, OWNER, app="hello", workdir="twice")])
        await until_all(database_url, [job], "PREPROCESSED")
        # Killed and reset while still queued: launch-alpha now holds two job.preprocessed.
        kill = JobKilled.create(site=SITE, aggregate_id=job, actor=f"user:{OWNER}")
        await log.append(kill, expect=await last_seq(database_url, job))
        await until_all(database_url, [job], "KILLED")
        reset = JobReset.create(site=SITE, aggregate_id=job, actor=f"user:{OWNER}")
        await log.append(reset, expect=await last_seq(database_url, job))
        await until_all(database_url, [job], "PREPROCESSED")
        stop = asyncio.Event()
        pilot = asyncio.create_task(run_launcher(site.directory, wall_time_min=10, stop=stop))
        await until_all(database_url, [job], "JOB_FINISHED")
        # ... and it keeps working.
        [later] = await submit(js, [job_created(SITE, OWNER, app="hello", workdir="later")])
        await until_all(database_url, [later], "JOB_FINISHED")
        stop.set()
        report = await asyncio.wait_for(pilot, 30)
    assert report.exit_reason == "stopped"
    assert (report.started, report.finished) == (2, 2)
    assert report.duplicates == 1  # the newer delivery, while the stale one was held
    assert report.lost_races == 1  # the stale one's lease, refused by compare-and-set
    assert await started_counts(database_url, [job, later]) == {job: 1, later: 1}


def forged_deliveries() -> list[tuple[str, bytes]]:
    """What a compromised site key can publish on its own launch subjects."""

    def preprocessed(actor: str, work_site: str) -> tuple[str, bytes]:
        spec = JobSpec.model_validate({"site": work_site, "app": "hello", "workdir": "forged"})
        event = JobPreprocessed.create(
            site=SITE, aggregate_id=uuid.uuid4(), actor=actor, data=StepData(work=spec)
        )
        return event.subject, encode(event)

    return [
        preprocessed(f"site:{SITE}", "beta"),  # work of another site, through our subject
        preprocessed("site:beta", SITE),  # signed as another site
        (f"evt.{SITE}.job.{uuid.uuid4()}.preprocessed", b"\x00\xff not an event"),
    ]


async def test_forged_and_garbled_deliveries_are_skipped_and_counted(
    secure_nats: SecureNats, database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    site = secure_site_dir(secure_nats, tmp_path)
    forged = forged_deliveries()
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        as_site = await connect_site(secure_nats, SITE)
        try:
            for subject, data in forged:  # the server stores them: sites may publish the type
                await jetstream(as_site).publish(subject, data)
        finally:
            await as_site.close()
        [job] = await submit(js, [job_created(SITE, OWNER, app="hello", workdir="real")])
        stop = asyncio.Event()
        pilot = asyncio.create_task(run_launcher(site.directory, wall_time_min=10, stop=stop))
        await until_all(database_url, [job], "JOB_FINISHED")
        stop.set()
        report = await asyncio.wait_for(pilot, 30)
    assert report.skipped == len(forged)
    assert (report.started, report.finished) == (1, 1)
    skipped = [r.getMessage() for r in caplog.records if "skipped delivery" in r.getMessage()]
    assert len(skipped) == len(forged)
    assert any("names site 'beta'" in line for line in skipped)
    assert any("signed by site:beta" in line for line in skipped)


async def test_work_without_a_job_created_is_refused_after_asking_again(
    secure_nats: SecureNats,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A direct get may be answered by a replica still catching up (a node back from a
    partition): the pilot asks again before refusing work whose job.created it cannot see.
    Work nobody submitted is still refused; submitted work read from a lagging replica runs."""
    site = secure_site_dir(secure_nats, tmp_path)
    spec = JobSpec.model_validate({"site": SITE, "app": "hello", "workdir": "unsubmitted"})
    unsubmitted = JobPreprocessed.create(
        site=SITE, aggregate_id=uuid.uuid4(), actor=f"site:{SITE}", data=StepData(work=spec)
    )
    asked: list[uuid.UUID] = []

    async def lagging_replica(js: Any, site_name: str, job_id: uuid.UUID) -> JobSpec | None:
        """A double of the read: the first two answers for a job come from a replica that
        has not stored its job.created yet."""
        asked.append(job_id)
        if asked.count(job_id) <= 2:
            return None
        return await created_spec(js, site_name, job_id)

    monkeypatch.setattr(running_module, "created_spec", lagging_replica)
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        as_site = await connect_site(secure_nats, SITE)
        try:
            await jetstream(as_site).publish(unsubmitted.subject, encode(unsubmitted))
        finally:
            await as_site.close()
        [job] = await submit(js, [job_created(SITE, OWNER, app="hello", workdir="lagging")])
        stop = asyncio.Event()
        pilot = asyncio.create_task(run_launcher(site.directory, wall_time_min=10, stop=stop))
        await until_all(database_url, [job], "JOB_FINISHED")
        async with asyncio.timeout(60):
            while asked.count(unsubmitted.aggregate_id) < MISSING_CREATED_DELIVERIES:
                await asyncio.sleep(0.2)
        stop.set()
        report = await asyncio.wait_for(pilot, 30)
    assert (report.started, report.finished, report.skipped) == (1, 1, 1)
    assert asked.count(job) == 3
    assert asked.count(unsubmitted.aggregate_id) == MISSING_CREATED_DELIVERIES
