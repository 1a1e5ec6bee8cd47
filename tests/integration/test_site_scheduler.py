"""The site agent's scheduler module against the real log, with the fake scheduler: requests
submitted once and followed to their end, refusals recorded, deletions, a scheduler away.

Real pilots in real batch jobs are tests/integration/test_site_pilots.py (local scheduler)
and tests/integration/test_slurm_pilots.py (a real Slurm).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from nats.js import JetStreamContext

from lodestream.agents.site.connect import connect_site, disconnect
from lodestream.agents.site.scheduler import PilotScheduler
from lodestream.agents.site.scheduler.decide import job_name
from lodestream.agents.site.settings import SiteSettings
from lodestream.eventlog import EventLog, jetstream
from lodestream.platform_adapters.errors import SchedulerTimeout
from lodestream.platform_adapters.schedulers import FakeOutcome, FakeScheduler
from lodestream.platform_adapters.schedulers.base import BatchRequest
from lodestream.schemas.events.batch import BatchFinishedData
from lodestream.schemas.subjects import EVENTS_STREAM
from tests.fixtures.nats import SecureNats
from tests.integration.test_launcher import control_plane
from tests.support.batch import (
    ask_for_pilot,
    ask_to_delete,
    batch_events,
    batch_types,
    until_batch,
)
from tests.support.builders import site_registered
from tests.support.running import running_until_stopped
from tests.support.site import secure_site_dir

SITE, OWNER = "alpha", "ada"
SYNC = {"sync_interval_s": 0.1}


@pytest.fixture
def site(secure_nats: SecureNats, tmp_path: Path) -> SiteSettings:
    return secure_site_dir(
        secure_nats, tmp_path,
        scheduler={**SYNC, "queue": "debug", "options": {"constraint": "cpu"},
                   "request_options": ["qos"]},
    )  # fmt: skip


@asynccontextmanager
async def running(
    settings: SiteSettings, scheduler: FakeScheduler, **options: Any
) -> AsyncIterator[PilotScheduler]:
    """The scheduler module alone, on the site's own connection (wss, its nkey)."""
    nc = await connect_site(settings, "scheduler-test")
    module = PilotScheduler(jetstream(nc), settings, scheduler, **options)
    try:
        async with running_until_stopped(module.run):
            yield module
    finally:
        await disconnect(nc)


@asynccontextmanager
async def stack(secure_nats: SecureNats, dsn: str) -> AsyncIterator[JetStreamContext]:
    async with control_plane(secure_nats, dsn) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        yield js


async def pending_acks(js: JetStreamContext) -> int:
    return int((await js.consumer_info(EVENTS_STREAM, f"sched-{SITE}")).num_ack_pending)


async def test_a_request_is_submitted_and_followed_to_its_end(
    secure_nats: SecureNats, database_url: str, site: SiteSettings
) -> None:
    now = [1_000_000.0]  # the fake's clock, stepped by hand: queued 10 s, then running 10 s
    fake = FakeScheduler(FakeOutcome(queued_s=10, run_s=10), clock=lambda: now[0])
    async with stack(secure_nats, database_url) as js, running(site, fake) as module:
        batch, _ = await ask_for_pilot(js, SITE, OWNER, num_nodes=3, wall_time_min=20,
                                       options={"qos": "high"})  # fmt: skip
        for state in ("queued", "running", "finished"):
            row = await until_batch(database_url, batch, state)
            now[0] += 10
        assert await pending_acks(js) == 0  # held while it lived, acknowledged at its end
        assert await batch_types(js, SITE, batch) == [
            "batch.requested", "batch.submitted", "batch.queued", "batch.running",
            "batch.finished",
        ]  # fmt: skip
    [job] = fake.submitted
    assert (row["scheduler"], row["scheduler_id"], row["exit_code"], row["scheduler_state"]) == (
        "fake", job.scheduler_id, 0, "finished",
    )  # fmt: skip
    assert job.request == BatchRequest(
        queue="debug", nodes=3, wall_time_min=20, job_name=job_name(batch),
        options={"constraint": "cpu", "qos": "high"}, env={"LODE_BATCH_JOB_ID": str(batch)},
    )  # fmt: skip
    script = job.script_path.read_text()
    assert script.startswith("#!/bin/bash\n#FAKE nodes=3 wall_time_min=20\n")
    assert f"--batch-job-id {batch}" in script
    assert module.stats.submitted == 1


async def test_refusals_are_recorded_with_the_words_of_whoever_refused(
    secure_nats: SecureNats, database_url: str, site: SiteSettings
) -> None:
    fake = FakeScheduler(FakeOutcome(run_s=None))
    async with stack(secure_nats, database_url) as js, running(site, fake) as module:
        fake.reject_submissions("sbatch: error: Invalid account or account/partition combination")
        by_scheduler, _ = await ask_for_pilot(js, SITE, OWNER)
        first = await until_batch(database_url, by_scheduler, "submit_failed")
        fake.reject_submissions(None)
        by_site, _ = await ask_for_pilot(js, SITE, OWNER, options={"export": "LD_PRELOAD=/x"})
        second = await until_batch(database_url, by_site, "submit_failed")
        (site.directory / "job-template.sh").write_text("module load {{ modules }}\n")
        by_template, _ = await ask_for_pilot(js, SITE, OWNER)
        third = await until_batch(database_url, by_template, "submit_failed")
        assert module.stats.submit_failed == 3
    assert first["reason"] == (
        "fake: sbatch: error: Invalid account or account/partition combination"
    )
    assert second["reason"] == ("scheduler option 'export' is not one this site lets requests "
                                "set (scheduler.request_options: qos)")  # fmt: skip
    assert third["reason"].startswith(
        f"{site.directory / 'job-template.sh'}, line 1: unknown placeholder {{{{ modules }}}}"
    )
    assert fake.submitted == []


async def test_a_requests_tag_filter_reaches_its_pilot_or_the_request_is_refused(
    secure_nats: SecureNats, database_url: str, site: SiteSettings
) -> None:
    fake = FakeScheduler(FakeOutcome(run_s=None))
    async with stack(secure_nats, database_url) as js, running(site, fake) as module:
        tags = {"beam": "A", "run": "7 b"}
        passed, _ = await ask_for_pilot(js, SITE, OWNER, filter_tags=tags)
        await until_batch(database_url, passed, "submitted", "queued", "running")
        # A template from before filter_tags existed would start a pilot that runs anything.
        (site.directory / "job-template.sh").write_text(
            "exec {{ lode }} launcher --site {{ site_dir }} --batch-job-id {{ batch_job_id }}\n"
        )
        dropped, _ = await ask_for_pilot(js, SITE, OWNER, filter_tags=tags)
        refused = await until_batch(database_url, dropped, "submit_failed")
        unfiltered, _ = await ask_for_pilot(js, SITE, OWNER)  # nothing to drop: submitted
        await until_batch(database_url, unfiltered, "submitted", "queued", "running")
        assert module.stats.submit_failed == 1
    first, last = fake.submitted
    assert "--tag beam:A --tag 'run:7 b'" in first.script_path.read_text()
    assert "--tag" not in last.script_path.read_text()
    assert refused["reason"].startswith(
        f"{site.directory / 'job-template.sh'} has no {{{{ tag_options }}}}, so its pilot "
        "would run jobs of any tags"
    )


async def test_a_request_is_submitted_once_whoever_handles_it_again(
    secure_nats: SecureNats, database_url: str, site: SiteSettings
) -> None:
    fake = FakeScheduler(FakeOutcome(run_s=None))
    async with stack(secure_nats, database_url) as js:
        async with running(site, fake) as first:
            batch, _ = await ask_for_pilot(js, SITE, OWNER)
            await until_batch(database_url, batch, "submitted")
            assert batch in first.tracked
        # Stopped: the held request went back to the server (well within its 120 s ack
        # wait); the next agent follows the batch job.
        async with running(site, fake) as second:
            async with asyncio.timeout(30):
                while batch not in second.tracked:
                    await asyncio.sleep(0.05)
            fake.finish(fake.submitted[0].scheduler_id)
            await until_batch(database_url, batch, "finished")
        assert (first.stats.submitted, second.stats.submitted) == (1, 0)
    assert len(fake.submitted) == 1


class HangsAfterQueueing(FakeScheduler):
    """sbatch queued the job, then hung until its timeout: the id never came back."""

    def submit_request(self, script_path: Path, request: BatchRequest) -> str:
        super().submit_request(script_path, request)
        if len(self.submitted) == 1:
            raise SchedulerTimeout("sbatch did not finish within 60 s (scheduler not responding?)")
        raise AssertionError("submitted a second time")


async def test_a_submission_whose_answer_was_lost_is_found_by_its_name(
    secure_nats: SecureNats, database_url: str, site: SiteSettings
) -> None:
    fake = HangsAfterQueueing(FakeOutcome(run_s=None))
    async with stack(secure_nats, database_url) as js, running(site, fake, retry_s=0.2):
        batch, _ = await ask_for_pilot(js, SITE, OWNER)
        row = await until_batch(database_url, batch, "submitted", "queued", "running")
    [job] = fake.submitted
    assert row["scheduler_id"] == job.scheduler_id


async def test_a_deletion_cancels_at_the_scheduler_and_the_end_says_so(
    secure_nats: SecureNats, database_url: str, site: SiteSettings
) -> None:
    fake = FakeScheduler(FakeOutcome(run_s=None))
    async with stack(secure_nats, database_url) as js, running(site, fake) as module:
        batch, _ = await ask_for_pilot(js, SITE, OWNER)
        await until_batch(database_url, batch, "running")
        await ask_to_delete(js, SITE, OWNER, batch)
        row = await until_batch(database_url, batch, "finished")
        assert module.stats.cancelled == 1
        assert (await batch_types(js, SITE, batch))[-2:] == [
            "batch.deletion_requested", "batch.finished",
        ]  # fmt: skip
    assert row["scheduler_state"] == "cancelled"
    assert fake.jobs[row["scheduler_id"]].cancelled_at is not None


async def test_a_pilot_deleted_before_it_was_submitted_is_never_submitted(
    secure_nats: SecureNats, database_url: str, site: SiteSettings
) -> None:
    fake = FakeScheduler(FakeOutcome(run_s=None))
    async with stack(secure_nats, database_url) as js:
        batch, seq = await ask_for_pilot(js, SITE, OWNER)
        await ask_to_delete(js, SITE, OWNER, batch, expect=seq)
        async with running(site, fake):
            row = await until_batch(database_url, batch, "finished")
    assert (row["scheduler_state"], row["reason"]) == (
        "cancelled", "deleted before it was submitted",
    )  # fmt: skip
    assert fake.submitted == []


async def test_a_scheduler_away_is_waited_out_and_a_vanished_job_ends(
    secure_nats: SecureNats, database_url: str, site: SiteSettings
) -> None:
    fake = FakeScheduler(FakeOutcome(run_s=None))
    async with stack(secure_nats, database_url) as js, running(site, fake) as module:
        batch, _ = await ask_for_pilot(js, SITE, OWNER)
        await until_batch(database_url, batch, "running")
        fake.unavailable = True
        async with asyncio.timeout(30):
            while module.stats.scheduler_errors < 3:
                await asyncio.sleep(0.05)
        fake.unavailable = False
        del fake.jobs[fake.submitted[0].scheduler_id]  # gone, and no record of it
        row = await until_batch(database_url, batch, "finished")
        finished = (await batch_events(js, SITE, batch))[-1]
    assert row["reason"].startswith("vanished from the queue: fake lists no job")
    assert finished.data == BatchFinishedData(state="unknown", reason=row["reason"])
