"""A pilot keeps a few deliveries beside its full slots (``launcher.prefetch``), unleased, to
start them the moment a slot frees. Kept is not taken: a pilot with room gets them
within seconds, a pilot that stops gives them back at once, and no job is leased twice
(checked against the raw ``job.started`` events)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import psycopg

from lodestream.agents.launcher.main import run as run_launcher
from lodestream.eventlog import EventLog
from lodestream.schemas.events import JobCreated
from tests.fixtures.nats import SecureNats
from tests.integration.test_launcher import (
    OWNER,
    SITE,
    control_plane,
    started_counts,
    states,
    submit,
    until_all,
)
from tests.support.builders import job_created, site_registered
from tests.support.site import secure_site_dir


async def lease_sessions(dsn: str, ids: list[uuid.UUID]) -> dict[uuid.UUID, uuid.UUID | None]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT id, lease_session FROM rm.jobs WHERE id = ANY(%s)", (ids,)
        )
        return {r[0]: r[1] for r in await cursor.fetchall()}


async def until_running(dsn: str, ids: list[uuid.UUID], count: int) -> None:
    async with asyncio.timeout(60):
        while (await states(dsn, ids)).get("RUNNING", 0) < count:
            await asyncio.sleep(0.05)


def sleepers(seconds: list[int]) -> list[JobCreated]:
    return [job_created(SITE, OWNER, app="sleeper", workdir=f"s/{i}",
                        parameters={"seconds": str(s)}) for i, s in enumerate(seconds)]  # fmt: skip


async def test_what_a_full_pilot_keeps_goes_to_a_pilot_with_room(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    settings = secure_site_dir(secure_nats, tmp_path, virtual_nodes=1, cores_per_node=1, prefetch=2)
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        ids = await submit(js, sleepers([8, 8, 8]))
        stop = asyncio.Event()
        first = asyncio.create_task(run_launcher(settings.directory, wall_time_min=10, stop=stop))
        await until_running(database_url, ids, 1)
        assert (await states(database_url, ids)).get("RUNNING") == 1  # two kept, not leased
        second = asyncio.create_task(run_launcher(settings.directory, wall_time_min=10, stop=stop))
        # The first pilot hands back what it kept within seconds; the second has a free slot.
        await until_running(database_url, ids, 2)
        assert len({s for s in (await lease_sessions(database_url, ids)).values() if s}) == 2
        await until_all(database_url, ids, "JOB_FINISHED", timeout_s=90)
        stop.set()
        reports = await asyncio.gather(first, second)
    assert sum(r.finished for r in reports) == 3
    assert all(r.finished >= 1 for r in reports)
    assert reports[0].returned >= 1  # what it kept while its slot stayed busy went back
    assert await started_counts(database_url, ids) == dict.fromkeys(ids, 1)


async def test_a_pilot_that_stops_gives_back_what_it_kept_unleased(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    settings = secure_site_dir(secure_nats, tmp_path, virtual_nodes=1, cores_per_node=1, prefetch=2)
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        running, *kept = await submit(js, sleepers([60, 1, 1]))
        stop = asyncio.Event()
        pilot = asyncio.create_task(run_launcher(settings.directory, wall_time_min=10, stop=stop))
        await until_running(database_url, [running], 1)
        stop.set()
        report = await pilot
        assert report.returned == 2
        # Drained: the running one timed out; the kept ones were never leased.
        assert (await states(database_url, [running])) == {"RUN_TIMEOUT": 1}
        assert await started_counts(database_url, kept) == {}
        again = asyncio.Event()
        other = asyncio.create_task(run_launcher(settings.directory, wall_time_min=10, stop=again))
        await until_all(database_url, kept, "JOB_FINISHED", timeout_s=60)
        again.set()
        await other
    assert await started_counts(database_url, kept) == dict.fromkeys(kept, 1)
