"""The site agent and pilots: clear startup errors, timeouts retried, NATS restarts survived."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from lodestream.agents.launcher.main import run as run_launcher
from lodestream.agents.site.main import run as run_site_agent
from lodestream.agents.site.settings import SiteSettings
from lodestream.eventlog import EventLog
from tests.fixtures.nats import SecureNats
from tests.integration.test_launcher import control_plane, submit, until_all
from tests.integration.test_launcher_faults import history
from tests.support.builders import job_created, site_registered
from tests.support.site import secure_site_dir

SITE, OWNER = "alpha", "ada"


@pytest.fixture
def site(secure_nats: SecureNats, tmp_path: Path) -> SiteSettings:
    return secure_site_dir(secure_nats, tmp_path)


def lode(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lodestream.client.cli.main", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("settings_yml", "message"),
    [
        ("site: Not A Slug\nnats: {url: 'wss://127.0.0.1:1'}\n", "site: String should match"),
        ("site: alpha\n", "nats: Field required"),
        ("site: alpha\nnats: {url: 'http://x'}\n", "nats.url: String should match"),
        ("site: alpha\nnats: {url: 'wss://127.0.0.1:1'}\nlauncher: {colour: red}\n",
         "launcher.colour: Extra inputs are not permitted"),
        ("site: [unclosed\n", "not valid YAML"),
        ("- just\n- a list\n", "expected a mapping"),
    ],
)  # fmt: skip
def test_a_malformed_settings_file_is_a_clear_startup_error(
    tmp_path: Path, settings_yml: str, message: str
) -> None:
    (tmp_path / "settings.yml").write_text(settings_yml)
    for command in (["site", "start", str(tmp_path)], ["launcher", "--site", str(tmp_path)]):
        result = lode(*command)
        assert result.returncode == 2
        assert message in result.stderr + result.stdout
        assert "settings.yml" in result.stderr + result.stdout


def test_a_broken_app_is_a_clear_startup_error(site: SiteSettings) -> None:
    (site.apps_dir / "broken.py").write_text(
        "from lodestream.agents.site.apps import ApplicationDefinition\n\n"
        "class Broken(ApplicationDefinition):\n"
        "    command_template = 'echo {{ x }}'\n"
        "    def run(self) -> None: ...\n"
    )
    result = lode("site", "start", str(site.directory))
    assert result.returncode == 2
    assert "broken.py" in result.stderr + result.stdout


async def test_a_drained_pilot_times_jobs_out_and_handle_timeout_retries_them(
    secure_nats: SecureNats, database_url: str, site: SiteSettings
) -> None:
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        [job] = await submit(js, [
            job_created(SITE, OWNER, app="sleeper", workdir="t", parameters={"seconds": "30"})
        ])  # fmt: skip
        stop_agent, stop_first = asyncio.Event(), asyncio.Event()
        agent = asyncio.create_task(run_site_agent(site.directory, stop=stop_agent))
        first = asyncio.create_task(run_launcher(site.directory, wall_time_min=10, stop=stop_first))
        await until_all(database_url, [job], "RUNNING")
        stop_first.set()  # what SIGTERM does: drain
        report = await first
        assert report.timed_out == 1
        await until_all(database_url, [job], "RESTART_READY")
        stop_agent.set()
        await agent
    events = await history(database_url, job)
    assert events[-2:] == ["job.run_timed_out", "job.restart_ready"]


async def test_agent_and_pilot_survive_a_nats_server_restart(
    secure_nats: SecureNats, database_url: str, site: SiteSettings
) -> None:
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        before = await submit(js, [
            job_created(SITE, OWNER, app="flaky", workdir=f"a/{i}", parameters={"tag": str(i)})
            for i in range(5)
        ])  # fmt: skip
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(run_site_agent(site.directory, stop=stop)),
            asyncio.create_task(run_launcher(site.directory, wall_time_min=10, stop=stop)),
        ]
        await until_all(database_url, before, "JOB_FINISHED")
        await asyncio.to_thread(secure_nats.server.stop)
        await asyncio.sleep(1.0)
        await asyncio.to_thread(secure_nats.server.start)
        after = await submit(js, [
            job_created(SITE, OWNER, app="flaky", workdir=f"b/{i}", parameters={"tag": str(i)})
            for i in range(5)
        ])  # fmt: skip
        await until_all(database_url, after, "JOB_FINISHED", timeout_s=90)
        stop.set()
        await asyncio.gather(*tasks)
