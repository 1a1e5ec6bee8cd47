"""Pilots as batch jobs of the local scheduler: the site agent renders the site's job template,
submits it, and a real ``lode launcher`` in that batch job connects and runs the site's jobs.

    request → batch.submitted → running (the pilot's session names its batch job) → its jobs
    run → the pilot idles out → batch.finished (exit 0); a deletion stops the pilot, and the
    job it ran times out naming the batch job, to run again in the next pilot. A request's
    filter_tags reach its pilot (``--tag``): it runs only the jobs that carry them.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from nats.js import JetStreamContext

from lodestream.agents.site.main import run as run_site_agent
from lodestream.agents.site.settings import SiteSettings
from lodestream.eventlog import EventLog
from tests.fixtures.nats import SecureNats
from tests.integration.test_launcher import control_plane, submit, until_all
from tests.support.batch import ask_for_pilot, ask_to_delete, until_batch
from tests.support.builders import job_created, site_registered
from tests.support.site import secure_site_dir
from tests.support.stack import kill_strays

SITE, OWNER = "alpha", "ada"
SLOW_FIRST = '''
from lodestream.agents.site.apps import ApplicationDefinition


class SlowFirst(ApplicationDefinition):
    """Outlasts its first pilot; done at once on its next attempt."""

    name = "slowfirst"
    command_template = (
        'if [ "$LODE_JOB_ATTEMPT" -lt 2 ]; then sleep {{ seconds }}; fi; echo done > done.txt'
    )
'''


@pytest.fixture
def site(secure_nats: SecureNats, tmp_path: Path) -> Iterator[SiteSettings]:
    settings = secure_site_dir(
        secure_nats, tmp_path, scheduler={"type": "local", "sync_interval_s": 0.2},
        idle_ttl_s=2,
    )  # fmt: skip
    (settings.apps_dir / "slowfirst.py").write_text(SLOW_FIRST)
    yield settings
    kill_strays(tmp_path)  # a pilot left behind by a failed test, and what it ran


@contextlib.asynccontextmanager
async def site_agent(settings: SiteSettings) -> AsyncIterator[None]:
    stop = asyncio.Event()
    agent = asyncio.create_task(run_site_agent(settings.directory, stop=stop))
    try:
        yield
    finally:
        stop.set()
        await agent


@contextlib.asynccontextmanager
async def stack(
    secure_nats: SecureNats, dsn: str, settings: SiteSettings
) -> AsyncIterator[JetStreamContext]:
    async with control_plane(secure_nats, dsn) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        async with site_agent(settings):
            yield js


def pilot_output(settings: SiteSettings) -> str:
    """The pilots' own output, for a failing test's report."""
    return "\n".join(p.read_text()[-3000:] for p in sorted((settings.directory / "batch").glob(
        "pilot-*.out")))  # fmt: skip


async def sessions_of(dsn: str, batch_id: uuid.UUID) -> list[tuple[uuid.UUID, str]]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT id, state FROM rm.sessions WHERE batch_job_id = %s", (batch_id,)
        )
        return [(r[0], str(r[1])) for r in await cursor.fetchall()]


async def timeout_cause(dsn: str, job_id: uuid.UUID) -> list[str]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT data->'cause' FROM rm.job_events WHERE job_id = %s "
            "AND type = 'job.run_timed_out'",
            (job_id,),
        )
        [(cause,)] = await cursor.fetchall()
        return list(cause)


async def test_a_pilot_in_a_local_batch_job_runs_the_sites_jobs_and_ends(
    secure_nats: SecureNats, database_url: str, site: SiteSettings
) -> None:
    async with stack(secure_nats, database_url, site) as js:
        jobs = await submit(js, [
            job_created(SITE, OWNER, app="hello", workdir=f"h/{i}", parameters={"who": str(i)})
            for i in range(3)
        ])  # fmt: skip
        batch, _ = await ask_for_pilot(js, SITE, OWNER, wall_time_min=5)
        try:
            await until_all(database_url, jobs, "JOB_FINISHED")
            row = await until_batch(database_url, batch, "finished")  # idle: the pilot exits
        except TimeoutError:
            pytest.fail(f"no pilot ran the jobs:\n{pilot_output(site)}")
    assert (row["scheduler"], row["exit_code"], row["scheduler_state"]) == ("local", 0, "finished")
    [(_, state)] = await sessions_of(database_url, batch)
    assert state == "closed"
    assert (site.data_dir / "h" / "2" / "greeting.txt").read_text() == "hello 2\n"


async def test_a_deleted_pilot_drains_naming_its_batch_job_and_the_next_pilot_reruns(
    secure_nats: SecureNats, database_url: str, site: SiteSettings
) -> None:
    async with stack(secure_nats, database_url, site) as js:
        [job] = await submit(js, [job_created(SITE, OWNER, app="slowfirst", workdir="slow",
                                              parameters={"seconds": "300"})])  # fmt: skip
        first, _ = await ask_for_pilot(js, SITE, OWNER, wall_time_min=5)
        try:
            await until_all(database_url, [job], "RUNNING")
        except TimeoutError:
            pytest.fail(f"no pilot started the job:\n{pilot_output(site)}")
        running = await until_batch(database_url, first, "running")
        await ask_to_delete(js, SITE, OWNER, first)
        ended = await until_batch(database_url, first, "finished")
        await until_all(database_url, [job], "RESTART_READY")
        second, _ = await ask_for_pilot(js, SITE, OWNER, wall_time_min=5)
        await until_all(database_url, [job], "JOB_FINISHED")
    assert ended["scheduler_state"] == "cancelled"
    [(session, _)] = await sessions_of(database_url, first)
    assert await timeout_cause(database_url, job) == [
        f"launcher {session} drained: stopped",
        f"batch job {first} (local {running['scheduler_id']}): "
        "told to stop (deleted, preempted or shut down)",
    ]
    assert len(await sessions_of(database_url, second)) == 1


async def leased_by(dsn: str, jobs: list[uuid.UUID]) -> dict[uuid.UUID, uuid.UUID | None]:
    """The batch job of the pilot that leased each job (``job.started``, each at most once)."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT e.job_id, s.batch_job_id FROM rm.job_events e JOIN rm.sessions s "
            "ON s.id = (e.data->>'session_id')::uuid "
            "WHERE e.job_id = ANY(%s) AND e.type = 'job.started'",
            (jobs,),
        )
        rows = await cursor.fetchall()
    assert len(rows) == len({r[0] for r in rows}), "a job was leased twice"
    return {r[0]: r[1] for r in rows}


@pytest.fixture
def patient_site(secure_nats: SecureNats, tmp_path: Path) -> Iterator[SiteSettings]:
    """Pilots that idle out after 6 s, not 2: a job one pilot hands back to another comes
    back to a pilot that wants it about a dozen times before that pilot gives up on it."""
    settings = secure_site_dir(
        secure_nats, tmp_path, scheduler={"type": "local", "sync_interval_s": 0.2},
        idle_ttl_s=6,
    )  # fmt: skip
    yield settings
    kill_strays(tmp_path)


async def test_pilots_asked_for_with_filter_tags_run_only_the_jobs_carrying_them(
    secure_nats: SecureNats, database_url: str, patient_site: SiteSettings
) -> None:
    site = patient_site
    async with stack(secure_nats, database_url, site) as js:
        beam_a = await submit(js, [
            job_created(SITE, OWNER, app="hello", workdir=f"a/{i}", tags={"beam": "A", "i": str(i)})
            for i in range(4)
        ])  # fmt: skip
        beam_b = await submit(js, [
            job_created(SITE, OWNER, app="hello", workdir=f"b/{i}", tags={"beam": "B"})
            for i in range(4)
        ])  # fmt: skip
        pilot_a, _ = await ask_for_pilot(js, SITE, OWNER, filter_tags={"beam": "A"})
        pilot_b, _ = await ask_for_pilot(js, SITE, OWNER, filter_tags={"beam": "B"})
        try:
            await until_all(database_url, [*beam_a, *beam_b], "JOB_FINISHED")
            ends = [await until_batch(database_url, b, "finished") for b in (pilot_a, pilot_b)]
        except TimeoutError:
            pytest.fail(f"the pilots did not run the jobs:\n{pilot_output(site)}")
    assert [(e["exit_code"], e["scheduler_state"]) for e in ends] == [(0, "finished")] * 2
    assert await leased_by(database_url, [*beam_a, *beam_b]) == (
        dict.fromkeys(beam_a, pilot_a) | dict.fromkeys(beam_b, pilot_b)
    )
    script = (site.directory / "batch" / f"pilot-{pilot_a}.sh").read_text()
    assert "--tag beam:A" in script
