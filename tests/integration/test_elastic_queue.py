"""The elastic queue end to end: real NATS (the site over wss with its own key), Postgres,
projector and controller, the site agent's scheduler module submitting to the fake
scheduler. Under a backlog the queue requests pilots, stops at max_queued_jobs, fits backfill
windows, deletes a batch job that waited too long and stops when the backlog is gone; every
decision is on the log with its inputs, and replays to itself."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from nats.js import JetStreamContext

from lodestream.agents.site.agent import SiteAgent
from lodestream.agents.site.apps import load_apps
from lodestream.agents.site.connect import connect_site
from lodestream.agents.site.elastic import ElasticQueue, ScalerLog, record
from lodestream.agents.site.scheduler import PilotScheduler
from lodestream.agents.site.settings import ElasticSettings, SiteSettings
from lodestream.eventlog import EventLog, ensure_streams, jetstream
from lodestream.natsconn import connect
from lodestream.platform_adapters.schedulers import BackfillWindow, FakeOutcome, FakeScheduler
from lodestream.schemas.codec import decode
from lodestream.schemas.events import BatchJobDeletionRequested, BatchJobRequested, JobKilled
from lodestream.schemas.events.batch import BatchRequestData
from lodestream.schemas.events.scaler import ScalerDecided
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.services.controller.backlog import newest_batch_seq
from lodestream.services.controller.loop import Controller
from tests.fixtures.nats import SecureNats
from tests.integration.test_launcher import submit, until_all
from tests.support.builders import job_created, site_registered
from tests.support.processes import TEST_HEARTBEAT_TTL_S
from tests.support.projection import running_projector
from tests.support.site import secure_site_dir

SITE, OWNER = "alpha", "ada"
OTHER, OTHER_OWNER = "beta", "bob"
SCALER_PERIOD_S = 0.2
SCHEDULER: dict[str, object] = {"sync_interval_s": 0.1}
LIMITS: dict[str, Any] = {
    "enabled": True, "period_s": 1, "queue": "debug", "project": "proj", "min_nodes": 1,
    "max_nodes": 2, "min_wall_time_min": 10, "max_wall_time_min": 60, "wall_time_pad_min": 5,
    "max_queued_jobs": 2,
}  # fmt: skip


@asynccontextmanager
async def control_plane(secure: SecureNats, dsn: str) -> AsyncIterator[JetStreamContext]:
    """Projector and controller, the controller looking at backlogs every 0.2 s."""
    nc = await connect(secure.settings())
    try:
        js = jetstream(nc)
        await ensure_streams(js, heartbeat_ttl_s=TEST_HEARTBEAT_TTL_S)
        controller = Controller(js, dsn, scaler_period_s=SCALER_PERIOD_S)
        stop = asyncio.Event()
        async with running_projector(js, dsn):
            task = asyncio.create_task(controller.run(stop))
            try:
                yield js
            finally:
                stop.set()
                await asyncio.wait_for(task, 10)
    finally:
        await nc.close()


@asynccontextmanager
async def site_log(site: SiteSettings) -> AsyncIterator[JetStreamContext]:
    """The site's own connection: wss, its nkey, nothing but its own subjects."""
    nc = await connect_site(site, "elastic-test")
    try:
        yield jetstream(nc)
    finally:
        await nc.close()


@asynccontextmanager
async def scheduler_module(site: SiteSettings, fake: FakeScheduler) -> AsyncIterator[None]:
    """The site agent's scheduler module, submitting what is requested to ``fake``."""
    async with site_log(site) as js:
        module = PilotScheduler(js, site, fake)
        stop = asyncio.Event()
        task = asyncio.create_task(module.run(stop))
        try:
            yield
        finally:
            stop.set()
            await asyncio.wait_for(task, 15)


def queued_forever() -> FakeScheduler:
    """A fake cluster where pilots wait in the queue until the test starts them."""
    return FakeScheduler(FakeOutcome(queued_s=10**9, run_s=None))


async def until_states(dsn: str, *wanted: str, timeout_s: float = 30) -> list[tuple[Any, ...]]:
    """The site's batch jobs, once their states are ``wanted`` (in creation order)."""
    async with asyncio.timeout(timeout_s):
        while True:
            found = await batch_jobs(dsn)
            if tuple(r[1] for r in found) == wanted:
                return found
            await asyncio.sleep(0.05)


async def rows(dsn: str, query: str, *args: Any) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(query, args)
        return list(await cursor.fetchall())


async def batch_jobs(dsn: str) -> list[tuple[Any, ...]]:
    return await rows(
        dsn,
        "SELECT id, state, num_nodes, wall_time_min, queue, project, requested_by, scheduler_id "
        "FROM rm.batch_jobs WHERE site = %s ORDER BY created_at, id",
        SITE,
    )


async def decisions(js: JetStreamContext, dsn: str) -> list[ScalerDecided]:
    """The site's decisions as they are on the log, in order (the read model says where)."""
    seqs = await rows(dsn, "SELECT seq FROM rm.scaler_decisions WHERE site = %s ORDER BY seq", SITE)
    found = []
    for (seq,) in seqs:
        event = decode((await js.get_msg(EVENTS_STREAM, seq)).data or b"")
        assert isinstance(event, ScalerDecided)
        found.append(event)
    return found


async def cycle_until(
    elastic: ElasticQueue,
    done: Callable[[], Any],
    *,
    between: Callable[[], Any] | None = None,
    timeout_s: float = 30,
) -> None:
    """Run the queue's cycles (as its period would) until ``await done()`` holds."""
    async with asyncio.timeout(timeout_s):
        while True:
            await elastic.run_cycle()
            if between is not None:
                await between()
            if await done():
                return
            await asyncio.sleep(0.1)


async def runnable_jobs(js: JetStreamContext, dsn: str, count: int, **spec: Any) -> list[uuid.UUID]:
    ids = await submit(js, [
        job_created(SITE, OWNER, app="hello", workdir=f"e/{uuid.uuid4()}", **spec)
        for _ in range(count)
    ])  # fmt: skip
    await until_all(dsn, ids, "PREPROCESSED")
    return ids


def requested(dsn: str, n: int) -> Callable[[], Any]:
    async def check() -> bool:
        return len(await batch_jobs(dsn)) >= n

    return check


async def test_the_queue_scales_up_to_max_queued_and_stops_when_the_backlog_is_gone(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    site = secure_site_dir(secure_nats, tmp_path, scheduler=SCHEDULER)
    fake = queued_forever()
    async with control_plane(secure_nats, database_url) as js:
        log = EventLog(js)
        await log.append(site_registered(SITE, OWNER), expect=0)
        await log.append(site_registered(OTHER, OTHER_OWNER), expect=0)
        jobs = await runnable_jobs(js, database_url, 6)
        await submit(js, [job_created(OTHER, OTHER_OWNER, app="hello", workdir="b")])
        async with site_log(site) as site_js, scheduler_module(site, fake):
            elastic = ElasticQueue(ScalerLog(site_js, SITE), SITE, ElasticSettings(**LIMITS))

            # No backlog has reached the site yet: its first decision says so, and announces
            # the queue to the controller, which answers with the backlog.
            assert await elastic.run_cycle() == "decided"

            await cycle_until(elastic, requested(database_url, 2))
            first = await until_states(database_url, "queued", "queued")
            assert [(r[2], r[3], r[4], r[5], r[6]) for r in first] == [
                (2, 10, "debug", "proj", "site:alpha")
            ] * 2  # 6 nodes short, 2 at most per job, 2 jobs at most in the queue
            assert sorted(j.request.nodes for j in fake.submitted) == [2, 2]
            for _ in range(5):  # more periods under the same backlog: max_queued_jobs holds
                await elastic.run_cycle()
                await asyncio.sleep(SCALER_PERIOD_S)
            assert len(await batch_jobs(database_url)) == 2

            # One pilot starts. A queue slot frees up, and 2 of the 6 nodes are still not
            # covered: one more job.
            fake.start(first[0][7])
            await until_states(database_url, "running", "queued")
            await cycle_until(elastic, requested(database_url, 3))
            assert (await batch_jobs(database_url))[2][2:4] == (2, 10)
            await until_states(database_url, "running", "queued", "queued")

            # The backlog goes away: the next decisions request nothing.
            for job in jobs:
                await log.append(JobKilled.create(site=SITE, aggregate_id=job,
                                                  actor=f"user:{OWNER}"), expect=None)  # fmt: skip
            await until_all(database_url, jobs, "KILLED")

            async def nothing_runnable() -> bool:
                return any(
                    d.data.reason == "nothing runnable" for d in await decisions(js, database_url)
                )

            await cycle_until(elastic, nothing_runnable)
            for _ in range(3):
                await elastic.run_cycle()
            assert len(await batch_jobs(database_url)) == 3
            assert len(fake.submitted) == 3
            assert elastic.faults == 0

        history = await decisions(js, database_url)
        assert history[0].data.reason == "no backlog from the control plane yet"
        assert history[0].data.backlog is None
        for decided in history:  # each with its inputs, and replaying to what it decided
            assert decided.actor == "site:alpha"
            assert decided.data.limits == ElasticSettings(**LIMITS).limits
            result = record.replay(decided)
            assert [p.request for p in result.requests] == [
                r.request for r in decided.data.requests
            ]
            assert result.reason == decided.data.reason
        asked = [d for d in history if d.data.requests]
        assert [len(d.data.requests) for d in asked] == [2, 1]
        assert asked[0].data.backlog is not None
        assert asked[0].data.backlog.runnable_jobs == 6
        assert asked[1].data.backlog is not None
        assert (asked[1].data.queued, asked[1].data.running) == (1, 1)
        assert history[-1].data.backlog is not None
        assert history[-1].data.backlog.runnable_jobs == 0
        # beta has no elastic queue: the controller says nothing about its backlog
        assert await rows(database_url, "SELECT site FROM rm.scalers") == [(SITE,)]
        quarantined = await rows(database_url, "SELECT reason FROM rm.quarantine")
        assert quarantined == []


async def test_backfill_windows_are_fitted_and_a_job_that_waited_too_long_is_deleted(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    site = secure_site_dir(secure_nats, tmp_path, scheduler=SCHEDULER)
    now = [datetime.now(UTC)]
    settings = ElasticSettings(**LIMITS | {
        "use_backfill": True, "max_nodes": 8, "max_queued_jobs": 1, "max_queue_wait_min": 30,
    })  # fmt: skip
    fake = queued_forever()
    fake.windows = [
        BackfillWindow(queue="debug", nodes=3, minutes=25),
        BackfillWindow(queue="debug", nodes=1, minutes=120),
        BackfillWindow(queue="other", nodes=50, minutes=None),
    ]
    async with control_plane(secure_nats, database_url) as js:
        log = EventLog(js)
        await log.append(site_registered(SITE, OWNER), expect=0)
        await runnable_jobs(js, database_url, 6, wall_time_min=25)
        async with site_log(site) as site_js, scheduler_module(site, fake):
            elastic = ElasticQueue(ScalerLog(site_js, SITE), SITE, settings, fake,
                                   clock=lambda: now[0])  # fmt: skip
            await cycle_until(elastic, requested(database_url, 1))
            [(first, _, nodes, wall, queue, *_)] = await until_states(database_url, "queued")
            # 6 nodes short, 8 allowed; the 3-node window of queue debug, 25 min less the pad
            assert (nodes, wall, queue) == (3, 20, "debug")
            [submitted] = fake.submitted
            assert (submitted.request.nodes, submitted.request.wall_time_min) == (3, 20)

            # Half an hour later it still waits in the queue: it is deleted and, in the same
            # decision, replaced by one fitted to the windows of now.
            fake.windows = [BackfillWindow(queue="debug", nodes=2, minutes=60)]
            now[0] += timedelta(minutes=31)
            await cycle_until(elastic, requested(database_url, 2))
            [(gone, *_), (_, _, nodes, wall, *_)] = await until_states(
                database_url, "finished", "queued"
            )
            assert gone == first
            assert (nodes, wall) == (2, 30)  # 25 + 5 pad fits 60 - 5
            assert fake.jobs[submitted.scheduler_id].cancelled_at is not None
            assert elastic.faults == 0

        history = await decisions(js, database_url)
        [deleting] = [d for d in history if d.data.deletions]
        assert deleting.data.deletions[0].batch_job_id == first
        assert deleting.data.windows == (deleting.data.requests[0].window,)
        assert "over max_queue_wait_min (30)" in deleting.data.deletions[0].reason
        [(state, scheduler_state)] = await rows(
            database_url, "SELECT state, scheduler_state FROM rm.batch_jobs WHERE id = %s", first
        )
        assert (state, scheduler_state) == ("finished", "cancelled")
        fitted = next(d for d in history if d.data.requests)
        assert fitted.data.windows is not None
        assert fitted.data.requests[0].window == fitted.data.windows[0]


async def test_the_site_agent_runs_the_elastic_queue_when_enabled(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    site = secure_site_dir(secure_nats, tmp_path, scheduler=SCHEDULER)
    enabled = site.model_copy(update={"elastic": ElasticSettings(**LIMITS)})
    fake = queued_forever()
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        await runnable_jobs(js, database_url, 1)
        async with site_log(site) as site_js:
            agent = SiteAgent(site_js, enabled, load_apps(site.apps_dir), scheduler=fake)
            assert agent.elastic is not None
            stop = asyncio.Event()
            task = asyncio.create_task(agent.run(stop))
            try:
                [(_, _, nodes, wall, *_)] = await until_states(database_url, "queued")
            finally:
                stop.set()
                await asyncio.wait_for(task, 15)
        assert (nodes, wall) == (1, 10)
        assert [j.request.nodes for j in fake.submitted] == [1]
        assert agent.elastic.outcomes["decided"] >= 2  # no backlog yet, then the request


async def test_the_controller_finds_a_sites_newest_batch_event_whatever_its_type(
    js: JetStreamContext,
) -> None:
    log = EventLog(js)
    first = await log.append(
        BatchJobRequested.create(site=SITE, aggregate_id=uuid.uuid4(), actor="site:alpha",
                                 data=BatchRequestData(num_nodes=1, wall_time_min=5)),
        expect=0,
    )  # fmt: skip
    deleted = await log.append(
        BatchJobDeletionRequested.create(site=SITE, aggregate_id=first.event.aggregate_id,
                                         actor="site:alpha"),
        expect=None,
    )  # fmt: skip
    await log.append(
        BatchJobRequested.create(site=OTHER, aggregate_id=uuid.uuid4(), actor="site:beta",
                                 data=BatchRequestData(num_nodes=1, wall_time_min=5)),
        expect=0,
    )  # fmt: skip
    newest = newest_batch_seq(js)
    assert await newest(SITE) == deleted.seq
    assert await newest("gamma") == 0
