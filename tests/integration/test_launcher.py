"""The pilot end to end: wss + site nkey, projector, controller, launcher running real tasks."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import psycopg
from nats.js import JetStreamContext

from lodestream.agents.launcher.launcher import LauncherReport
from lodestream.agents.launcher.main import run as run_launcher
from lodestream.agents.site.main import run as run_site_agent
from lodestream.eventlog import EventLog, ensure_streams, jetstream
from lodestream.natsconn import connect
from lodestream.schemas.events import JobCreated
from lodestream.schemas.events.job import FinishedData, StartedData
from tests.fixtures.nats import SecureNats
from tests.integration.test_controller import running_controller
from tests.support.builders import job_created, site_registered
from tests.support.processes import TEST_HEARTBEAT_TTL_S
from tests.support.projection import running_projector
from tests.support.site import secure_site_dir

SITE, OWNER = "alpha", "ada"


@asynccontextmanager
async def control_plane(
    secure_nats: SecureNats, dsn: str, *, heartbeat_ttl_s: float = TEST_HEARTBEAT_TTL_S
) -> AsyncIterator[JetStreamContext]:
    """Projector and controller on the control-plane connection; heartbeats expire after
    ``heartbeat_ttl_s``, which the site's pilots must agree with (tests/support/site.py)."""
    nc = await connect(secure_nats.settings())
    try:
        js = jetstream(nc)
        await ensure_streams(js, heartbeat_ttl_s=heartbeat_ttl_s)
        async with running_projector(js, dsn), running_controller(js, dsn):
            yield js
    finally:
        await nc.close()


async def states(dsn: str, ids: list[uuid.UUID]) -> dict[str, int]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT state, count(*) FROM rm.jobs WHERE id = ANY(%s) GROUP BY state", (ids,)
        )
        return {str(s): int(n) for s, n in await cursor.fetchall()}


async def until_all(dsn: str, ids: list[uuid.UUID], state: str, timeout_s: float = 60) -> None:
    async with asyncio.timeout(timeout_s):
        while (await states(dsn, ids)).get(state, 0) < len(ids):
            await asyncio.sleep(0.05)


async def started_counts(dsn: str, ids: list[uuid.UUID]) -> dict[uuid.UUID, int]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT job_id, count(*) FROM rm.job_events WHERE job_id = ANY(%s) "
            "AND type = 'job.started' GROUP BY job_id",
            (ids,),
        )
        return {r[0]: int(r[1]) for r in await cursor.fetchall()}


async def submit(js: JetStreamContext, jobs: list[JobCreated]) -> list[uuid.UUID]:
    log = EventLog(js)
    results = await log.append_many([(j, 0) for j in jobs])
    assert all(type(r).__name__ == "Appended" for r in results)
    return [j.aggregate_id for j in jobs]


async def test_launcher_runs_jobs_to_completion_over_wss(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    settings = secure_site_dir(secure_nats, tmp_path)
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        jobs = [
            job_created(
                SITE, OWNER, app="hello", workdir=f"hello/{i}",
                parameters={"who": f"job {i}; rm -rf /"},
            )
            for i in range(20)
        ]  # fmt: skip
        bad = job_created(SITE, OWNER, app="fails", workdir="bad", parameters={"why": "boom"})
        ids = await submit(js, [*jobs, bad])
        stop = asyncio.Event()
        launcher = asyncio.create_task(
            run_launcher(settings.directory, wall_time_min=10, stop=stop)
        )
        await until_all(database_url, ids[:-1], "JOB_FINISHED")
        await until_all(database_url, ids[-1:], "RUN_ERROR")
        stop.set()
        report: LauncherReport = await asyncio.wait_for(launcher, 30)
    assert report.finished == 20
    assert report.errored == 1
    assert set((await started_counts(database_url, ids)).values()) == {1}
    greeting = (settings.data_dir / "hello" / "3" / "greeting.txt").read_text()
    assert greeting == "hello job 3; rm -rf /\n"


async def test_two_launchers_never_run_the_same_job_twice(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    settings = secure_site_dir(secure_nats, tmp_path)
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        ids = await submit(
            js, [job_created(SITE, OWNER, app="hello", workdir=f"h/{i}") for i in range(200)]
        )
        stop = asyncio.Event()
        pilots = [
            asyncio.create_task(run_launcher(settings.directory, wall_time_min=10, stop=stop))
            for _ in range(2)
        ]
        await until_all(database_url, ids, "JOB_FINISHED", timeout_s=120)
        stop.set()
        reports = await asyncio.gather(*pilots)
    assert sum(r.finished for r in reports) == 200
    counts = await started_counts(database_url, ids)
    assert len(counts) == 200
    assert set(counts.values()) == {1}


async def test_errors_are_retried_within_the_budget_then_fail_with_cause(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    settings = secure_site_dir(secure_nats, tmp_path)
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        flaky = job_created(SITE, OWNER, app="flaky", workdir="flaky", parameters={"tag": "x"})
        doomed = job_created(SITE, OWNER, app="fails", workdir="doomed", parameters={"why": "no"})
        ids = await submit(js, [flaky, doomed])
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(run_site_agent(settings.directory, stop=stop)),
            asyncio.create_task(run_launcher(settings.directory, wall_time_min=10, stop=stop)),
        ]
        await until_all(database_url, ids[:1], "JOB_FINISHED")
        await until_all(database_url, ids[1:], "FAILED")
        stop.set()
        await asyncio.gather(*tasks)
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cursor = await conn.execute(
            "SELECT type FROM rm.job_events WHERE job_id = %s ORDER BY seq", (ids[0],)
        )
        flaky_history = [r[0] for r in await cursor.fetchall()]
        cursor = await conn.execute("SELECT last_error FROM rm.jobs WHERE id = %s", (ids[1],))
        (doomed_error,) = await cursor.fetchone() or ("",)
    assert flaky_history == [
        "job.created", "job.preprocessed", "job.started", "job.run_errored",
        "job.restart_ready", "job.started", "job.finished",  # the pilot finished it
    ]  # fmt: skip
    # retry_budget defaults to 3: four attempts, then FAILED with the stderr as cause.
    assert "retry budget exhausted" in doomed_error
    assert "no" in doomed_error


async def job_event_data(dsn: str, job_id: uuid.UUID, event_type: str) -> dict[str, object]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT data FROM rm.job_events WHERE job_id = %s AND type = %s", (job_id, event_type)
        )
        row = await cursor.fetchone()
        assert row is not None, f"no {event_type} for {job_id}"
        data: dict[str, object] = row[0]
        return data


async def test_python_function_app_result_and_exception_come_back(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    settings = secure_site_dir(secure_nats, tmp_path, processing={"retry_budget": 0})
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        good = job_created(SITE, OWNER, app="square", workdir="sq/good", parameters={"x": "7"})
        bad = job_created(SITE, OWNER, app="square", workdir="sq/bad", parameters={"x": "-1"})
        ids = await submit(js, [good, bad])
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(run_site_agent(settings.directory, stop=stop)),
            asyncio.create_task(run_launcher(settings.directory, wall_time_min=10, stop=stop)),
        ]
        await until_all(database_url, ids[:1], "JOB_FINISHED")
        await until_all(database_url, ids[1:], "FAILED")
        await asyncio.sleep(0.5)  # the cleaner acts on job.finished
        stop.set()
        await asyncio.gather(*tasks)
    # Nothing follows the run of `square`, so the pilot finished the job with the result in it.
    done = await job_event_data(database_url, ids[0], "job.finished")
    assert done["skipped"] == ["job.run_done", "job.postprocessed", "job.staged_out"]
    run = done["run"]
    assert isinstance(run, dict)
    assert run["result"] == {"square": 49}
    assert run["return_code"] == 0
    errored = await job_event_data(database_url, ids[1], "job.run_errored")
    assert "ValueError: negative input -1" in str(errored["stderr_tail"])
    assert "Traceback" in str(errored["stderr_tail"])
    # cleanup_files of a finished job are gone; a failed job's workdir is kept for inspection
    assert not (settings.data_dir / "sq/good/work.scratch").exists()
    assert (settings.data_dir / "sq/bad/work.scratch").exists()


async def test_a_pilot_never_leases_a_job_longer_than_its_remaining_wall_time(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    settings = secure_site_dir(secure_nats, tmp_path, idle_ttl_s=3)
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        long = job_created(SITE, OWNER, app="hello", workdir="long", wall_time_min=30)
        short = job_created(SITE, OWNER, app="hello", workdir="short", wall_time_min=1)
        ids = await submit(js, [long, short])
        report = await run_launcher(settings.directory, wall_time_min=5)
        assert report.exit_reason == "idle"
        assert report.finished == 1
    assert (await states(database_url, ids)) == {"PREPROCESSED": 1, "JOB_FINISHED": 1}


async def run_results(dsn: str, ids: list[uuid.UUID]) -> dict[uuid.UUID, FinishedData]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT job_id, data FROM rm.job_events WHERE job_id = ANY(%s) "
            "AND type = 'job.finished'",
            (ids,),
        )
        return {r[0]: FinishedData.model_validate(r[1]) for r in await cursor.fetchall()}


async def test_each_result_carries_the_runs_profile_with_the_real_pid(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    settings = secure_site_dir(secure_nats, tmp_path)
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        jobs = [job_created(SITE, OWNER, app="whoami", workdir=f"who/{i}") for i in range(4)]
        ids = await submit(js, jobs)
        stop = asyncio.Event()
        launcher = asyncio.create_task(
            run_launcher(settings.directory, wall_time_min=10, stop=stop)
        )
        await until_all(database_url, ids, "JOB_FINISHED")
        stop.set()
        await asyncio.wait_for(launcher, 30)
        results = await run_results(database_url, ids)
        leases = await started_pids(database_url, ids)
    assert set(results) == set(ids)
    for i, job_id in enumerate(ids):
        run = results[job_id].run
        assert run is not None
        profile = run.profile
        assert profile is not None
        # The shell the job ran in wrote its own pid: the profile names that very process.
        written = int((settings.data_dir / "who" / str(i) / "pid.txt").read_text())
        assert profile.pid == written
        assert profile.spawning_at is not None
        assert profile.started_at is not None
        assert profile.exited_at is not None
        assert profile.leased_at <= profile.spawning_at <= profile.started_at <= profile.exited_at
    # job.started is the lease, appended before any process exists: it names no pid.
    assert leases == dict.fromkeys(ids, None)


async def started_pids(dsn: str, ids: list[uuid.UUID]) -> dict[uuid.UUID, int | None]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT job_id, data FROM rm.job_events WHERE job_id = ANY(%s) "
            "AND type = 'job.started'",
            (ids,),
        )
        return {r[0]: StartedData.model_validate(r[1]).pid for r in await cursor.fetchall()}
