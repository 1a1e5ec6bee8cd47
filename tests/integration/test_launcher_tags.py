"""Pilots with a tag filter (``lode launcher --tag key:value``), as Balsam's launcher ``--tag``.

Each job runs once, on a pilot whose filter its tags match; a pilot hands every other job back
unleased (and counts it), and jobs of other tags queued ahead of a pilot's own never hold its
own up. A pilot without a filter takes everything.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from pathlib import Path

import psycopg
from nats.js import JetStreamContext

from lodestream.agents.launcher.main import run as run_launcher
from lodestream.agents.launcher.report import LauncherReport
from lodestream.agents.site.settings import SiteSettings
from lodestream.eventlog import EventLog
from tests.fixtures.nats import SecureNats
from tests.integration.test_launcher import control_plane, started_counts, states, until_all
from tests.integration.test_launcher import submit as append_jobs
from tests.support.builders import job_created, site_registered
from tests.support.site import secure_site_dir

SITE, OWNER = "alpha", "ada"


async def submit(js: JetStreamContext, tags: Mapping[str, str], count: int) -> list[uuid.UUID]:
    return await append_jobs(js, [
        job_created(SITE, OWNER, app="hello", workdir=f"{uuid.uuid4()}", tags=dict(tags))
        for _ in range(count)
    ])  # fmt: skip


async def ran_on(dsn: str, ids: list[uuid.UUID]) -> dict[uuid.UUID, uuid.UUID]:
    """The session that leased each job that was leased."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT job_id, data->>'session_id' FROM rm.job_events "
            "WHERE job_id = ANY(%s) AND type = 'job.started'",
            (ids,),
        )
        return {r[0]: uuid.UUID(r[1]) for r in await cursor.fetchall()}


async def open_sessions(dsn: str) -> list[uuid.UUID]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT id FROM rm.sessions WHERE site = %s ORDER BY opened_at", (SITE,)
        )
        return [r[0] for r in await cursor.fetchall()]


async def start_pilot(
    settings: SiteSettings, dsn: str, stop: asyncio.Event, filter_tags: Mapping[str, str]
) -> tuple[asyncio.Task[LauncherReport], uuid.UUID]:
    """A pilot with ``filter_tags``, and its session once it is open."""
    before = await open_sessions(dsn)
    pilot = asyncio.create_task(run_launcher(
        settings.directory, wall_time_min=10, stop=stop, filter_tags=filter_tags,
    ))  # fmt: skip
    async with asyncio.timeout(30):
        while len(sessions := await open_sessions(dsn)) == len(before):
            await asyncio.sleep(0.05)
    [session] = set(sessions) - set(before)
    return pilot, session


async def test_each_job_runs_once_on_a_pilot_whose_filter_it_matches(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    settings = secure_site_dir(secure_nats, tmp_path)
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        # Jobs neither pilot may take, runnable before the others: every pilot meets them.
        other = [*await submit(js, {"beam": "C"}, 3), *await submit(js, {}, 3),
                 *await submit(js, {"beam": "AB"}, 2)]  # fmt: skip
        await until_all(database_url, other, "PREPROCESSED")
        a = [*await submit(js, {"beam": "A"}, 8), *await submit(js, {"beam": "A", "run": "7"}, 4)]
        b = await submit(js, {"beam": "B"}, 12)
        stop = asyncio.Event()
        pilot_a, session_a = await start_pilot(settings, database_url, stop, {"beam": "A"})
        pilot_b, session_b = await start_pilot(settings, database_url, stop, {"beam": "B"})
        await until_all(database_url, [*a, *b], "JOB_FINISHED")
        left = await states(database_url, other)
        stop.set()
        reports = await asyncio.gather(pilot_a, pilot_b)
    assert left == {"PREPROCESSED": len(other)}  # handed back, never leased
    assert await started_counts(database_url, [*a, *b, *other]) == dict.fromkeys([*a, *b], 1)
    sessions = await ran_on(database_url, [*a, *b])
    assert {sessions[job] for job in a} == {session_a}
    assert {sessions[job] for job in b} == {session_b}
    assert [r.started for r in reports] == [len(a), len(b)]
    assert sum(r.filtered for r in reports) >= len(other)  # each was offered at least once


async def test_a_pilot_without_a_filter_takes_what_a_filtered_one_left(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    settings = secure_site_dir(secure_nats, tmp_path)
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        rest = [*await submit(js, {"beam": "B"}, 4), *await submit(js, {}, 4)]
        await until_all(database_url, rest, "PREPROCESSED")
        a = await submit(js, {"beam": "A"}, 4)
        stop = asyncio.Event()
        pilot_a, session_a = await start_pilot(settings, database_url, stop, {"beam": "A"})
        await until_all(database_url, a, "JOB_FINISHED")
        assert await states(database_url, rest) == {"PREPROCESSED": len(rest)}
        anyone, session_any = await start_pilot(settings, database_url, stop, {})
        await until_all(database_url, rest, "JOB_FINISHED")
        stop.set()
        report_a, report_any = await asyncio.gather(pilot_a, anyone)
    sessions = await ran_on(database_url, [*a, *rest])
    assert {sessions[job] for job in a} == {session_a}
    assert {sessions[job] for job in rest} == {session_any}
    assert set((await started_counts(database_url, [*a, *rest])).values()) == {1}
    assert report_a.filtered >= len(rest)  # all of them came to it first
    assert (report_any.started, report_any.filtered) == (len(rest), 0)


async def test_jobs_of_other_tags_queued_ahead_do_not_hold_up_a_pilots_own(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    # The consumer hands out redeliveries before new messages: the pilot must still walk past
    # the hundreds it hands back to reach its own, queued behind them.
    settings = secure_site_dir(secure_nats, tmp_path)
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        ahead = await submit(js, {"beam": "B"}, 400)
        await until_all(database_url, ahead, "PREPROCESSED", timeout_s=120)
        own = await submit(js, {"beam": "A"}, 4)
        stop = asyncio.Event()
        pilot, _ = await start_pilot(settings, database_url, stop, {"beam": "A"})
        await until_all(database_url, own, "JOB_FINISHED", timeout_s=60)
        stop.set()
        report = await pilot
    assert report.started == len(own)
    assert report.filtered >= len(ahead)
    assert await states(database_url, ahead) == {"PREPROCESSED": len(ahead)}
