"""A kill reaches the running task even when the pilot did not hear it live.

Kills travel on a core subscription, which is not replayed. A pilot cut off from NATS
when the user kills a job learns of it when it reconnects; one that misses a kill with
no reconnect to tell it (the message lost, or sent before its subscription reached the
server) learns of it from its periodic check. Either way the task is stopped and nothing
is reported for it. The pilot runs in-process so its report can be read; its tasks are
real processes.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from lodestream.agents.launcher.main import run as run_launcher
from lodestream.agents.launcher.report import LauncherReport
from lodestream.agents.launcher.watch import JobWatch
from lodestream.eventlog import EventLog
from lodestream.schemas.events import JobKilled
from lodestream.schemas.subjects import EVENTS_STREAM
from tests.fixtures.nats import SecureNats
from tests.integration.test_launcher import control_plane, submit, until_all
from tests.integration.test_launcher_faults import history, processes_running
from tests.integration.test_launcher_outages import until_logged
from tests.support.builders import job_created, site_registered
from tests.support.projection import wait_for_position
from tests.support.proxy import CutProxy
from tests.support.site import secure_site_dir

pytestmark = pytest.mark.slow
SITE, OWNER = "alpha", "ada"
# An unusual duration, so that the test finds its own task among the host's processes.
SLEEP = "987.25"
# Long enough that being cut off while the job is killed does not expire the session.
TTL_S = 15
NOTHING_REPORTED = ["job.created", "job.preprocessed", "job.started", "job.killed"]


async def kill(js: Any, dsn: str, job: uuid.UUID) -> None:
    """What the API does for ``lode job kill``: append job.killed on the job's last event."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute("SELECT last_seq FROM rm.jobs WHERE id = %s", (job,))
        (last,) = await cursor.fetchone() or (0,)
    killed = JobKilled.create(site=SITE, aggregate_id=job, actor=f"user:{OWNER}")
    await EventLog(js).append(killed, expect=int(last))


async def until_task_gone(timeout_s: float = 30) -> None:
    async with asyncio.timeout(timeout_s):
        while await asyncio.to_thread(processes_running, b"sleep\x00" + SLEEP.encode()):
            await asyncio.sleep(0.1)


async def settled_history(js: Any, dsn: str, job: uuid.UUID) -> list[str]:
    """The job's events once the projector has everything the log holds."""
    await wait_for_position(dsn, (await js.stream_info(EVENTS_STREAM)).state.last_seq)
    return await history(dsn, job)


def assert_killed_and_unreported(report: LauncherReport) -> None:
    assert report.killed == 1
    assert (report.finished, report.errored, report.timed_out, report.fenced) == (0, 0, 0, 0)


async def test_a_kill_issued_while_the_pilot_is_cut_off_stops_the_task_once_it_is_back(
    secure_nats: SecureNats,
    database_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def never(self: JobWatch, interval_s: float, stop: asyncio.Event) -> None:
        await stop.wait()

    # Only the reconnect may tell the pilot here: its periodic check is the next test's.
    monkeypatch.setattr(JobWatch, "check_forever", never)
    assert secure_nats.server.config.websocket_port is not None
    async with CutProxy(secure_nats.server.config.websocket_port) as link:
        site = secure_site_dir(secure_nats, tmp_path, wss_url=f"wss://127.0.0.1:{link.port}",
                               heartbeat_ttl_s=TTL_S)  # fmt: skip
        async with control_plane(secure_nats, database_url, heartbeat_ttl_s=TTL_S) as js:
            await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
            [job] = await submit(js, [job_created(
                SITE, OWNER, app="sleeper", workdir="cut", parameters={"seconds": SLEEP}
            )])  # fmt: skip
            stop = asyncio.Event()
            pilot = asyncio.create_task(run_launcher(site.directory, wall_time_min=10, stop=stop))
            await until_all(database_url, [job], "RUNNING")

            await link.cut()
            await until_logged(caplog, "disconnected from NATS")
            await kill(js, database_url, job)  # nobody can tell the pilot now
            await until_all(database_url, [job], "KILLED")
            await link.restore()

            await until_logged(caplog, "job.killed while NATS was unreachable")
            await until_task_gone()
            stop.set()
            report = await asyncio.wait_for(pilot, 30)
            events = await settled_history(js, database_url, job)
    assert_killed_and_unreported(report)
    assert report.exit_reason == "stopped"
    assert events == NOTHING_REPORTED


async def test_a_kill_the_live_feed_missed_is_found_by_the_periodic_check(
    secure_nats: SecureNats,
    database_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def deaf(self: JobWatch, msg: Any) -> None:
        return None  # the kill was lost on the way, and no reconnect says so

    monkeypatch.setattr(JobWatch, "on_killed", deaf)
    site = secure_site_dir(secure_nats, tmp_path)
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        [job] = await submit(js, [job_created(
            SITE, OWNER, app="sleeper", workdir="deaf", parameters={"seconds": SLEEP}
        )])  # fmt: skip
        stop = asyncio.Event()
        pilot = asyncio.create_task(run_launcher(site.directory, wall_time_min=10, stop=stop))
        await until_all(database_url, [job], "RUNNING")
        await kill(js, database_url, job)

        await until_logged(caplog, "job.killed (found by the periodic check)")
        await until_task_gone()
        stop.set()
        report = await asyncio.wait_for(pilot, 30)
        events = await settled_history(js, database_url, job)
    assert_killed_and_unreported(report)
    assert not any("disconnected from NATS" in r.getMessage() for r in caplog.records)
    assert events == NOTHING_REPORTED
