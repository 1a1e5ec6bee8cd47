"""Pilots and NATS outages: a short outage is ridden out, a pilot started early waits for NATS.

The NATS server is really stopped and started again on the same ports and store (the
secure fixture: TLS, wss, site nkeys); the pilot runs in-process so its report can be read.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from lodestream.agents.launcher.main import run as run_launcher
from lodestream.eventlog import EventLog
from tests.fixtures.nats import SecureNats
from tests.integration.test_launcher import control_plane, started_counts, submit, until_all
from tests.integration.test_launcher_faults import history
from tests.support.builders import job_created, site_registered
from tests.support.site import secure_site_dir

pytestmark = pytest.mark.slow
SITE, OWNER = "alpha", "ada"
# Long enough that a 4 s outage plus a beat interval (TTL/3) and the reconnect stay inside it.
OUTAGE_TTL_S = 15
OUTAGE_S = 4.0


async def until_logged(caplog: pytest.LogCaptureFixture, text: str, timeout_s: float = 30) -> None:
    async with asyncio.timeout(timeout_s):
        while not any(text in record.getMessage() for record in caplog.records):
            await asyncio.sleep(0.05)


async def test_a_pilot_rides_out_a_nats_outage_shorter_than_its_lease(
    secure_nats: SecureNats, database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    site = secure_site_dir(secure_nats, tmp_path, heartbeat_ttl_s=OUTAGE_TTL_S)
    async with control_plane(secure_nats, database_url, heartbeat_ttl_s=OUTAGE_TTL_S) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        # One job ends during the outage (its result waits for NATS), one after it.
        ids = await submit(js, [
            job_created(SITE, OWNER, app="sleeper", workdir=f"o/{s}", parameters={"seconds": s})
            for s in ("3", "9")
        ])  # fmt: skip
        stop = asyncio.Event()
        pilot = asyncio.create_task(run_launcher(site.directory, wall_time_min=10, stop=stop))
        await until_all(database_url, ids, "RUNNING")
        await asyncio.to_thread(secure_nats.server.stop)
        await asyncio.sleep(OUTAGE_S)
        await asyncio.to_thread(secure_nats.server.start)
        await until_all(database_url, ids, "JOB_FINISHED", timeout_s=60)
        stop.set()
        report = await asyncio.wait_for(pilot, 30)
    assert any("disconnected from NATS" in r.getMessage() for r in caplog.records)
    assert (report.finished, report.fenced, report.timed_out) == (2, 0, 0)
    assert report.exit_reason == "stopped"
    assert set((await started_counts(database_url, ids)).values()) == {1}
    for job in ids:
        events = await history(database_url, job)
        assert events == ["job.created", "job.preprocessed", "job.started", "job.finished"]


async def test_a_lapsed_heartbeat_alone_is_no_verdict_and_unsent_results_are_retried(
    secure_nats: SecureNats, database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The pilot counts its heartbeat lapsed after 4 s; the server expires it only after 20.
    # An outage of 7 s makes the pilot doubt, not give up: once back, it asks the log, finds
    # its session alive, and goes on. A result it could not send (NATS's answer is awaited
    # 5 s) is sent again; its fixed event id makes the retry safe.
    site = secure_site_dir(secure_nats, tmp_path, heartbeat_ttl_s=4)
    async with control_plane(secure_nats, database_url, heartbeat_ttl_s=20) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        ids = await submit(js, [
            job_created(SITE, OWNER, app="sleeper", workdir=f"l/{s}", parameters={"seconds": s})
            for s in ("1", "12")
        ])  # fmt: skip
        stop = asyncio.Event()
        pilot = asyncio.create_task(run_launcher(site.directory, wall_time_min=10, stop=stop))
        await until_all(database_url, ids, "RUNNING")
        await asyncio.to_thread(secure_nats.server.stop)
        await until_logged(caplog, "checking whether it expired")
        await until_logged(caplog, "append job.finished")  # the short job's result, unsent
        await asyncio.sleep(1.0)
        await asyncio.to_thread(secure_nats.server.start)
        await until_all(database_url, ids, "JOB_FINISHED", timeout_s=60)
        stop.set()
        report = await asyncio.wait_for(pilot, 30)
    assert (report.finished, report.fenced, report.timed_out) == (2, 0, 0)
    assert set((await started_counts(database_url, ids)).values()) == {1}
    for job in ids:
        events = await history(database_url, job)
        assert events == ["job.created", "job.preprocessed", "job.started", "job.finished"]


async def test_a_pilot_started_while_nats_is_down_opens_its_session_once_it_is_back(
    secure_nats: SecureNats, database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="lodestream.agents.site.retry")
    site = secure_site_dir(secure_nats, tmp_path)
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        [job] = await submit(js, [job_created(SITE, OWNER, app="hello", workdir="late")])
        await until_all(database_url, [job], "PREPROCESSED")
        await asyncio.to_thread(secure_nats.server.stop)
        stop = asyncio.Event()
        pilot = asyncio.create_task(run_launcher(site.directory, wall_time_min=10, stop=stop))
        # It neither crashes nor gives up: each failed try is logged, with a growing pause.
        await until_logged(caplog, "launcher: connect to wss://127.0.0.1")
        await until_logged(caplog, "try 2 failed")
        assert not pilot.done()
        await asyncio.to_thread(secure_nats.server.start)
        await until_all(database_url, [job], "JOB_FINISHED", timeout_s=60)
        stop.set()
        report = await asyncio.wait_for(pilot, 30)
    assert (report.started, report.finished) == (1, 1)
    assert report.exit_reason == "stopped"


async def test_a_pilot_stopped_before_nats_answers_exits_cleanly(
    secure_nats: SecureNats, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    site = secure_site_dir(secure_nats, tmp_path)
    await asyncio.to_thread(secure_nats.server.stop)
    stop = asyncio.Event()
    pilot = asyncio.create_task(run_launcher(site.directory, wall_time_min=10, stop=stop))
    await until_logged(caplog, "try 1 failed")
    stop.set()  # what SIGTERM does
    report = await asyncio.wait_for(pilot, 30)
    assert report.exit_reason == "stopped"
    assert report.started == 0
