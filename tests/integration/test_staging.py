"""Data staging end to end: the controller's steps, the site's transfer module and the local
backend, on real nats-server and Postgres, with a real site agent and pilot.

The "remote" location is a directory of this machine served by the local backend
(``local:<dir>``): the same module, events and backend code path as any location.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from nats.js import JetStreamContext

from lodestream.agents.launcher.main import run as run_launcher
from lodestream.agents.site.main import run as run_site_agent
from lodestream.agents.site.settings import SiteSettings
from lodestream.eventlog import EventLog
from lodestream.schemas.resources import TransferSpec
from tests.fixtures.nats import SecureNats
from tests.integration.test_launcher import control_plane, submit, until_all
from tests.support.builders import job_created, site_registered
from tests.support.site import secure_site_dir

SITE, OWNER = "alpha", "ada"


@pytest.fixture
def remote(tmp_path: Path) -> Path:
    """The beamline's storage: two inputs and a directory of calibration files."""
    root = tmp_path / "beamline"
    (root / "calib").mkdir(parents=True)
    (root / "raw.txt").write_text("raw-frame\n")
    (root / "calib" / "a.txt").write_text("calib-a\n")
    (root / "calib" / "b.txt").write_text("calib-b\n")
    (root / "results").mkdir()
    return root


@pytest.fixture
def site(secure_nats: SecureNats, tmp_path: Path, remote: Path) -> SiteSettings:
    transfers = {
        "locations": {"beamline": f"local:{remote}"},
        "poll_interval_s": 0.1, "batch_size": 8, "max_concurrent": 2, "retry_budget": 1,
    }  # fmt: skip
    return secure_site_dir(secure_nats, tmp_path / "sites", transfers=transfers)


def reduce_job(workdir: str, *, raw: str = "/raw.txt", location: str = "beamline") -> Any:
    return job_created(
        SITE, OWNER, app="reduce", workdir=workdir,
        transfers={
            "raw": TransferSpec(location=location, path=raw),
            "calib": TransferSpec(location=location, path="/calib", recursive=True),
            "result": TransferSpec(location=location, path=f"/results/{workdir}.txt"),
        },
    )  # fmt: skip


@asynccontextmanager
async def running_site(
    secure_nats: SecureNats, database_url: str, site: SiteSettings
) -> AsyncIterator[JetStreamContext]:
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(run_site_agent(site.directory, stop=stop)),
            asyncio.create_task(run_launcher(site.directory, wall_time_min=10, stop=stop)),
        ]
        try:
            await app_known(database_url, "reduce")
            yield js
        finally:
            stop.set()
            await asyncio.gather(*tasks)


async def items(dsn: str, job: uuid.UUID) -> list[tuple[str, str, str, int, int | None, str]]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT slot, direction, state, attempts, bytes_transferred, coalesce(reason, '') "
            "FROM rm.transfer_items WHERE job_id = %s ORDER BY direction, slot",
            (job,),
        )
        return [tuple(row) for row in await cursor.fetchall()]


async def event_types(dsn: str, job: uuid.UUID) -> list[str]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT type FROM rm.job_events WHERE job_id = %s ORDER BY seq", (job,)
        )
        return [row[0] for row in await cursor.fetchall()]


async def failure(dsn: str, job: uuid.UUID) -> str:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT data->>'reason' FROM rm.job_events WHERE job_id = %s AND type = 'job.failed'",
            (job,),
        )
        row = await cursor.fetchone()
        return str(row[0]) if row else ""


async def test_two_inputs_in_and_one_output_out_and_the_files_are_where_they_should_be(
    secure_nats: SecureNats, database_url: str, site: SiteSettings, remote: Path
) -> None:
    async with running_site(secure_nats, database_url, site) as js:
        [job] = await submit(js, [reduce_job("r1")])
        await until_all(database_url, [job], "JOB_FINISHED", timeout_s=90)
    workdir = site.data_dir / "r1"
    assert (workdir / "in" / "raw.txt").read_text() == "raw-frame\n"
    assert sorted(p.name for p in (workdir / "in" / "calib").iterdir()) == ["a.txt", "b.txt"]
    assert (remote / "results" / "r1.txt").read_text() == "raw-frame\ncalib-a\ncalib-b\n"
    assert await items(database_url, job) == [
        ("calib", "in", "succeeded", 1, 16, ""),
        ("raw", "in", "succeeded", 1, 10, ""),
        ("result", "out", "succeeded", 1, 26, ""),
    ]
    assert await event_types(database_url, job) == [
        "job.created", "job.ready", "job.staged_in", "job.preprocessed", "job.started",
        "job.run_done", "job.postprocessed", "job.staged_out", "job.finished",
    ]  # fmt: skip


async def test_a_missing_input_fails_the_job_with_the_backends_words(
    secure_nats: SecureNats, database_url: str, site: SiteSettings
) -> None:
    async with running_site(secure_nats, database_url, site) as js:
        [job] = await submit(js, [reduce_job("r2", raw="/not-there.txt")])
        await until_all(database_url, [job], "FAILED", timeout_s=90)
    reason = await failure(database_url, job)
    assert reason.startswith("stage-in of slot 'raw' failed: ")
    assert "No such file" in reason or "not found" in reason.lower()
    [_, raw] = await items(database_url, job)
    assert raw[2:4] == ("failed", 1)  # permanent: not retried
    assert "job.started" not in await event_types(database_url, job)


async def test_a_location_the_site_does_not_have_fails_the_job_at_once(
    secure_nats: SecureNats, database_url: str, site: SiteSettings
) -> None:
    async with running_site(secure_nats, database_url, site) as js:
        # Appended straight to the log: the api would refuse it (test_api_submit covers that).
        [job] = await submit(js, [reduce_job("r3", location="laptop")])
        await until_all(database_url, [job], "FAILED", timeout_s=90)
    reason = await failure(database_url, job)
    assert "has no transfer location 'laptop'" in reason


async def test_the_site_declares_its_locations(
    secure_nats: SecureNats, database_url: str, site: SiteSettings, remote: Path
) -> None:
    async with running_site(secure_nats, database_url, site):
        async with asyncio.timeout(30):
            while True:
                async with await psycopg.AsyncConnection.connect(database_url) as conn:
                    cursor = await conn.execute(
                        "SELECT transfer_locations FROM rm.sites WHERE name = %s", (SITE,)
                    )
                    row = await cursor.fetchone()
                if row and row[0]:
                    break
                await asyncio.sleep(0.05)
    assert row[0] == {"beamline": f"local:{remote}"}


async def app_known(dsn: str, app: str) -> None:
    async with asyncio.timeout(60):
        while True:
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                cursor = await conn.execute(
                    "SELECT 1 FROM rm.apps WHERE site = %s AND name = %s", (SITE, app)
                )
                if await cursor.fetchone():
                    return
            await asyncio.sleep(0.05)


async def submitted_tasks(dsn: str, job: uuid.UUID) -> dict[str, str]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT slot, task_id FROM rm.transfer_items WHERE job_id = %s AND state = 'submitted'",
            (job,),
        )
        return {str(slot): str(task) for slot, task in await cursor.fetchall()}


async def test_an_agent_stopped_mid_transfer_hands_it_on_and_nothing_moves_twice(
    secure_nats: SecureNats, database_url: str, site: SiteSettings, remote: Path
) -> None:
    """The first agent's tasks are held in flight (a simulated per-task latency) when it
    stops; the next agent reads the items from the log and polls the same tasks: one item per
    slot, one submission each, the job finished."""
    settings_file = site.directory / "settings.yml"
    original = settings_file.read_text()
    assert "simulated_task_latency_s: 0.0" in original
    settings_file.write_text(original.replace("simulated_task_latency_s: 0.0",
                                              "simulated_task_latency_s: 600.0"))  # fmt: skip
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        stop_first = asyncio.Event()
        first = asyncio.create_task(run_site_agent(site.directory, stop=stop_first))
        await app_known(database_url, "reduce")  # else the job is created without its steps
        [job] = await submit(js, [reduce_job("r4")])
        async with asyncio.timeout(60):
            while len(tasks := await submitted_tasks(database_url, job)) < 2:
                await asyncio.sleep(0.05)
        stop_first.set()
        await first
        settings_file.write_text(original)
        stop = asyncio.Event()
        agent = asyncio.create_task(run_site_agent(site.directory, stop=stop))
        pilot = asyncio.create_task(run_launcher(site.directory, wall_time_min=10, stop=stop))
        await until_all(database_url, [job], "JOB_FINISHED", timeout_s=90)
        stop.set()
        await asyncio.gather(agent, pilot)
    assert [row[:4] for row in await items(database_url, job)] == [
        ("calib", "in", "succeeded", 1), ("raw", "in", "succeeded", 1),
        ("result", "out", "succeeded", 1),
    ]  # fmt: skip
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cursor = await conn.execute(
            "SELECT slot, task_id FROM rm.transfer_items WHERE job_id = %s AND direction = 'in'",
            (job,),
        )
        assert {str(s): str(t) for s, t in await cursor.fetchall()} == tasks
    assert (remote / "results" / "r4.txt").read_text() == "raw-frame\ncalib-a\ncalib-b\n"


async def test_a_cacheable_input_moves_in_once_and_serves_every_later_job(
    secure_nats: SecureNats, database_url: str, tmp_path: Path, remote: Path
) -> None:
    (remote / "frame-a.dat").write_bytes(b"a" * 1000)
    (remote / "frame-b.dat").write_bytes(b"b" * 2000)
    transfers = {
        "locations": {"beamline": f"local:{remote}"}, "poll_interval_s": 0.1,
        "stage_cache_bytes": 1_000_000,
    }  # fmt: skip
    site = secure_site_dir(secure_nats, tmp_path / "cached", transfers=transfers)
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(run_site_agent(site.directory, stop=stop)),
            asyncio.create_task(run_launcher(site.directory, wall_time_min=10, stop=stop)),
        ]
        await app_known(database_url, "ingest")
        jobs = await submit(js, [
            job_created(SITE, OWNER, app="ingest", workdir=f"i{n}", transfers={
                "frame": TransferSpec(location="beamline", path=f"/frame-{'ab'[n % 2]}.dat")})
            for n in range(8)
        ])  # fmt: skip
        await until_all(database_url, jobs, "JOB_FINISHED", timeout_s=90)
        stop.set()
        await asyncio.gather(*tasks)
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cursor = await conn.execute(
            "SELECT remote->>'path', count(*) FILTER (WHERE bytes_transferred > 0), count(*) "
            "FROM rm.transfer_items WHERE site = %s AND state = 'succeeded' "
            "AND job_id = ANY(%s) GROUP BY 1 ORDER BY 1", (SITE, jobs),
        )  # fmt: skip
        moved = await cursor.fetchall()
    assert moved == [("/frame-a.dat", 1, 4), ("/frame-b.dat", 1, 4)]  # one move each, 3 served
    for n in range(8):
        assert (site.data_dir / f"i{n}" / "in" / "frame.dat").stat().st_size == 1000 * (1 + n % 2)
