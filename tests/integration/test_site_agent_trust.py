"""The site agent applies the shared rule to ``process-<site>`` work before any hook runs."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from lodestream.agents.launcher.main import run as run_launcher
from lodestream.agents.site.agent import SiteAgent
from lodestream.agents.site.apps import load_apps
from lodestream.agents.site.connect import connect_site as connect_as_agent
from lodestream.eventlog import EventLog, jetstream
from lodestream.schemas.codec import encode
from lodestream.schemas.events import JobRunErrored
from lodestream.schemas.events.job import RunResultData
from lodestream.schemas.resources import JobSpec
from tests.fixtures.nats import SecureNats, connect_site
from tests.integration.test_launcher import control_plane, submit, until_all
from tests.integration.test_launcher_faults import history
from tests.support.builders import job_created, site_registered
from tests.support.site import secure_site_dir

SITE, OWNER = "alpha", "ada"


def forged_work() -> list[tuple[str, bytes]]:
    """A run error of another site's job, sent through ours, and garbage on a work subject."""
    spec = JobSpec.model_validate({"site": "beta", "app": "flaky", "workdir": "forged"})
    errored = JobRunErrored.create(
        site=SITE, aggregate_id=uuid.uuid4(), actor=f"launcher:{uuid.uuid4()}",
        data=RunResultData(return_code=1, work=spec),
    )  # fmt: skip
    return [
        (errored.subject, encode(errored)),
        (f"evt.{SITE}.job.{uuid.uuid4()}.staged_in", b"{not json"),
    ]


async def test_forged_work_is_skipped_and_counted_and_real_work_goes_on(
    secure_nats: SecureNats, database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    site = secure_site_dir(secure_nats, tmp_path)
    forged = forged_work()
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        as_site = await connect_site(secure_nats, SITE)
        try:
            for subject, data in forged:
                await jetstream(as_site).publish(subject, data)
        finally:
            await as_site.close()
        # flaky fails once: its retry needs the agent's handle_error, after the forgeries.
        [job] = await submit(js, [
            job_created(SITE, OWNER, app="flaky", workdir="f", parameters={"tag": "t"})
        ])  # fmt: skip
        nc = await connect_as_agent(site, "site-agent")
        try:
            agent = SiteAgent(jetstream(nc), site, load_apps(site.apps_dir))
            stop = asyncio.Event()
            tasks = [
                asyncio.create_task(agent.run(stop)),
                asyncio.create_task(run_launcher(site.directory, wall_time_min=10, stop=stop)),
            ]
            await until_all(database_url, [job], "JOB_FINISHED")
            stop.set()
            await asyncio.gather(*tasks)
        finally:
            await nc.close()
    assert agent.skipped == len(forged)
    assert "job.restart_ready" in await history(database_url, job)
    skipped = [r.getMessage() for r in caplog.records if "refused delivery" in r.getMessage()]
    assert any("names site 'beta'" in line for line in skipped)
