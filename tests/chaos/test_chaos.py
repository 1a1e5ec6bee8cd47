"""Chaos under load (issue 9): every component SIGKILLed in turn while jobs run.

The projector, the controller, the site agent, a pilot, nats-server and
Postgres are each killed and brought back, ``plan.rounds`` times, while
jobs (some in parent → child → grandchild chains) are submitted in waves.
Afterwards every job is final, none was lost, every second run is explained
by a lease expiry or a run timeout on the log, the app ran no more often
than the log says it started, and the read model equals a fresh rebuild.

The CI run is small; ``make chaos`` sets ``LODE_CHAOS_JOBS=500
LODE_CHAOS_ROUNDS=3`` (see :class:`tests.support.chaos.ChaosPlan`).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from pathlib import Path

import nats.errors
import psycopg
import pytest
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from lodestream.agents.site.settings import SiteSettings
from lodestream.eventlog import EventLog, ensure_streams, jetstream
from lodestream.infra.postgres.server import EmbeddedPostgres
from lodestream.natsconn import connect
from lodestream.schemas.subjects import EVENTS_STREAM, HB_STREAM
from lodestream.schemas.topology import SITE_CONSUMERS
from tests.chaos.verify import check, compare_with_rebuild, final_states, read_log, summary
from tests.chaos.workload import APP, submit_waves, workload
from tests.fixtures.nats import SecureNats
from tests.support.builders import site_registered
from tests.support.chaos import CHAOS_DATABASE, Chaos, ChaosPlan
from tests.support.processes import TEST_HEARTBEAT_TTL_S, service_env
from tests.support.projection import wait_for_position

# Alone (after the parallel part of `make test`): each kill is recovered within a heartbeat
# TTL, which other tests' load on a small machine would stretch.
pytestmark = [pytest.mark.slow, pytest.mark.alone]
PLAN = ChaosPlan.from_env()
SITE, OWNER = "alpha", "ada"
FINAL = frozenset({"JOB_FINISHED", "FAILED", "KILLED"})


@pytest.mark.timeout(PLAN.timeout_s)
async def test_every_job_survives_each_component_killed_in_turn(
    secure_nats: SecureNats,
    chaos_postgres: EmbeddedPostgres,
    chaos_site: SiteSettings,
    tmp_path: Path,
) -> None:
    dsn = chaos_postgres.url(CHAOS_DATABASE)
    (tmp_path / "logs").mkdir()
    chaos = Chaos(
        nats=secure_nats.server, postgres=chaos_postgres,
        service_env=service_env(secure_nats.settings(), dsn),
        site_dir=chaos_site.directory, log_dir=tmp_path / "logs", plan=PLAN,
    )  # fmt: skip
    waves = workload(PLAN, SITE, OWNER, waves=max(int(PLAN.chaos_s), 1))
    ids = [job.aggregate_id for wave in waves for job in wave.jobs]
    nc = await connect(secure_nats.settings().model_copy(update={"name": "chaos-test"}))
    try:
        js = jetstream(nc)
        await start_stack(js, chaos, dsn)
        stop = asyncio.Event()
        supervisor = asyncio.create_task(chaos.supervise(stop))
        try:
            spacing = PLAN.chaos_s / len(waves)
            submitter = asyncio.create_task(submit_waves(js, waves, spacing, timeout_s=120))
            await chaos.run_schedule()
            submitted = await submitter
            landed = submitted.landed_unacknowledged
            what = f"{submitted.retries} appends retried; {len(landed)} had landed unacknowledged"
            chaos.note("test", f"all {len(ids)} jobs submitted ({what}: {landed})")
            await until_final(dsn, ids, timeout_s=120 + PLAN.jobs * 0.5, chaos=chaos)
        finally:
            stop.set()
            await supervisor
        # The pilots say goodbye (session.closed); then the projector catches up and stops.
        await asyncio.to_thread(chaos.stop_site)
        await asyncio.to_thread(chaos.services["controller"].stop)
        log = await read_log(js)
        await wait_for_position(dsn, log.last_seq, timeout_s=60)
        await asyncio.to_thread(chaos.services["projector"].stop)
        problems = await check(log, dsn, ids, waves, chaos_site.data_dir)
        print(summary(log, ids, waves, chaos_site.data_dir, rounds=PLAN.rounds))
        # As an operator would: on a quiet system, the pilots' heartbeats aged out of HB.
        await until_quiet(js, HB_STREAM, timeout_s=30)
        problems += await compare_with_rebuild(js, dsn, timeout_s=20 + log.last_seq / 500)
    finally:
        await asyncio.to_thread(chaos.stop_all)
        await nc.close()
        print(f"what happened:\n{chaos.report()}")
    problems += [f"{h.component} ended on its own: {h.what}" for h in chaos.unexpected]
    assert not problems, "\n".join(problems)


async def start_stack(js: JetStreamContext, chaos: Chaos, dsn: str) -> None:
    """Services, the site's consumers, the agent (and its app), then the pilots."""
    await ensure_streams(js, heartbeat_ttl_s=TEST_HEARTBEAT_TTL_S)
    await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
    chaos.start_service("projector")
    chaos.start_service("controller")
    async with asyncio.timeout(60):
        for consumer in (feed.durable(SITE) for feed in SITE_CONSUMERS):
            while not await consumer_exists(js, consumer):
                await asyncio.sleep(0.1)
    chaos.start_service("agent")
    async with asyncio.timeout(60):
        while not await app_known(dsn, APP):
            await asyncio.sleep(0.1)
    for _ in range(PLAN.pilots):
        chaos.start_pilot()
    chaos.note("test", "stack up")


async def consumer_exists(js: JetStreamContext, name: str) -> bool:
    """Whether the consumer exists; False too while JetStream cannot say (a cluster that
    has just started, or is electing a leader, answers nothing for a while)."""
    try:
        await js.consumer_info(EVENTS_STREAM, name)
    except (NotFoundError, nats.errors.TimeoutError, nats.errors.NoRespondersError):
        return False
    return True


async def app_known(dsn: str, app: str) -> bool:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute("SELECT 1 FROM rm.apps WHERE site = %s AND name = %s",
                                    (SITE, app))  # fmt: skip
        return await cursor.fetchone() is not None


async def until_quiet(js: JetStreamContext, stream: str, timeout_s: float) -> None:
    """Wait (bounded) until ``stream`` holds no message; go on regardless after ``timeout_s``."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            while (await js.stream_info(stream)).state.messages:
                await asyncio.sleep(0.5)


async def until_final(dsn: str, ids: list[uuid.UUID], timeout_s: float, chaos: Chaos) -> None:
    """Wait (bounded) until every job is final; the checks afterwards say which are not."""
    states: Counter[str] = Counter()
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                with contextlib.suppress(psycopg.OperationalError):
                    states = await final_states(dsn, ids)
                    if sum(n for s, n in states.items() if s in FINAL) == len(ids):
                        chaos.note("test", f"every job final: {dict(states)}")
                        return
                await asyncio.sleep(0.5)
    except TimeoutError:
        chaos.note("test", f"not every job final after {timeout_s:g} s: {dict(states)}")
