"""Python-function jobs in the pilot's warm workers, end to end against a real nats-server.

What the pilot appends for a job that a warm worker ran is what it appended for a fresh
interpreter; these are the cases where the worker itself must go: the job hangs past its
time limit, the user kills it, the pilot loses its lease. Every test also checks that the
pilot's next function job still runs.
"""

from __future__ import annotations

import asyncio
import os
import signal
import textwrap
from pathlib import Path
from typing import Any

import pytest

from lodestream.agents.launcher import running as running_module
from lodestream.agents.launcher.appends import append_or_keep
from lodestream.agents.launcher.main import run as run_launcher
from lodestream.agents.site.settings import SiteSettings
from lodestream.eventlog import EventLog
from lodestream.schemas.subjects import EVENTS_STREAM
from tests.fixtures.nats import SecureNats
from tests.integration.test_launcher import (
    control_plane,
    job_event_data,
    submit,
    until_all,
)
from tests.integration.test_launcher_faults import history, spawn, stop
from tests.integration.test_launcher_kills import kill
from tests.support.builders import job_created, site_registered
from tests.support.projection import wait_for_position
from tests.support.site import secure_site_dir

pytestmark = pytest.mark.slow
SITE, OWNER = "alpha", "ada"
APPS = """
import os
import time
from pathlib import Path

from lodestream.agents.site.apps import ApplicationDefinition


class Hang(ApplicationDefinition):
    name = "hang"

    def run(self) -> None:
        Path("pid").write_text(str(os.getpid()))
        while True:
            time.sleep(0.05)


class Pid(ApplicationDefinition):
    name = "pid"

    def run(self) -> int:
        return os.getpid()
"""


def warm_site(secure_nats: SecureNats, tmp_path: Path, **python_workers: object) -> SiteSettings:
    settings = secure_site_dir(
        secure_nats, tmp_path, processing={"retry_budget": 0},
        python_workers=python_workers, virtual_nodes=1, cores_per_node=2,
    )  # fmt: skip
    (settings.apps_dir / "warm.py").write_text(textwrap.dedent(APPS))
    return settings


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


async def worker_pid(workdir: Path) -> int:
    async with asyncio.timeout(30):
        while not (workdir / "pid").exists() or not (workdir / "pid").read_text():
            await asyncio.sleep(0.05)
    return int((workdir / "pid").read_text())


async def until_gone(pid: int) -> None:
    async with asyncio.timeout(20):
        while alive(pid):
            await asyncio.sleep(0.05)


async def test_a_hung_function_job_fails_at_its_time_limit_with_the_cause(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    settings = warm_site(secure_nats, tmp_path, time_limit_s=1)
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        [hung] = await submit(js, [job_created(SITE, OWNER, app="hang", workdir="h")])
        stop_ = asyncio.Event()
        pilot = asyncio.create_task(run_launcher(settings.directory, wall_time_min=10, stop=stop_))
        await until_all(database_url, [hung], "RUN_ERROR")
        [after] = await submit(js, [job_created(SITE, OWNER, app="pid", workdir="p")])
        await until_all(database_url, [after], "JOB_FINISHED")
        stop_.set()
        await pilot
    errored = await job_event_data(database_url, hung, "job.run_errored")
    assert errored["return_code"] == -signal.SIGKILL
    assert "ran past its time limit of 1 s" in str(errored["stderr_tail"])
    assert not alive(int((settings.data_dir / "h" / "pid").read_text()))


async def test_a_function_job_killed_by_its_user_takes_its_worker_with_it(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    settings = warm_site(secure_nats, tmp_path)
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        [job] = await submit(js, [job_created(SITE, OWNER, app="hang", workdir="k")])
        stop_ = asyncio.Event()
        pilot = asyncio.create_task(run_launcher(settings.directory, wall_time_min=10, stop=stop_))
        await until_all(database_url, [job], "RUNNING")
        pid = await worker_pid(settings.data_dir / "k")
        await kill(js, database_url, job)
        await until_all(database_url, [job], "KILLED")
        await until_gone(pid)
        [after] = await submit(js, [job_created(SITE, OWNER, app="pid", workdir="p")])
        await until_all(database_url, [after], "JOB_FINISHED")
        stop_.set()
        report = await pilot
    assert report.killed == 1
    assert (await history(database_url, job))[-1] == "job.killed"


async def test_a_pilot_that_lost_its_lease_kills_the_worker_running_the_job(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    settings = warm_site(secure_nats, tmp_path)
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        [job] = await submit(js, [job_created(SITE, OWNER, app="hang", workdir="z")])
        zombie = spawn("launcher", settings, tmp_path / "zombie.log")
        try:
            await until_all(database_url, [job], "RUNNING", timeout_s=60)
            pid = await worker_pid(settings.data_dir / "z")
            zombie.send_signal(signal.SIGSTOP)
            # The heartbeat TTL runs out; the controller times the run out (fencing).
            await until_all(database_url, [job], "RUN_TIMEOUT", timeout_s=30)
            assert alive(pid)  # the worker is not the pilot: only the pilot can stop it
            zombie.send_signal(signal.SIGCONT)
            await until_gone(pid)
            zombie.terminate()
            await asyncio.to_thread(zombie.wait, 30)
        finally:
            stop(zombie)
        everything = (await js.stream_info(EVENTS_STREAM)).state.last_seq
        await wait_for_position(database_url, everything, timeout_s=30)
    events = await history(database_url, job)
    assert events == ["job.created", "job.preprocessed", "job.started", "job.run_timed_out"]
    assert "1 fenced" in (tmp_path / "zombie.log").read_text()


async def test_slots_run_the_next_jobs_while_the_log_takes_the_results(
    secure_nats: SecureNats, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every result append held back, a 2-slot pilot still runs all its jobs: a slot
    waits on the log for its next lease, never for its last result."""
    settings = warm_site(secure_nats, tmp_path)
    gate = asyncio.Event()

    async def held(*args: Any, **kwargs: Any) -> Any:
        await gate.wait()
        return await append_or_keep(*args, **kwargs)

    monkeypatch.setattr(running_module, "append_or_keep", held)
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        jobs = [job_created(SITE, OWNER, app="pid", workdir=f"p/{i}", node_packing_count=2)
                for i in range(6)]  # fmt: skip
        ids = await submit(js, jobs)
        stop_ = asyncio.Event()
        pilot = asyncio.create_task(run_launcher(settings.directory, wall_time_min=10, stop=stop_))
        results = [
            settings.data_dir / "p" / str(i) / ".lode" / "pyrun-result.json" for i in range(6)
        ]
        async with asyncio.timeout(60):  # every job ran, none of their results appended
            while not all(r.exists() for r in results):
                await asyncio.sleep(0.05)
        await until_all(database_url, ids, "RUNNING")  # and no further: nothing reported
        gate.set()
        await until_all(database_url, ids, "JOB_FINISHED")
        stop_.set()
        report = await pilot
    assert report.finished == 6
