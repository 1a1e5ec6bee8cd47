"""Retries back off: the waits are in the job's events, pilots honour them, and a controller
killed during a wait changes nothing (the wait is kept by the launch consumer, not a service)."""

from __future__ import annotations

import asyncio
import signal
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from lodestream.agents.launcher.main import run as run_launcher
from lodestream.agents.site.main import run as run_site_agent
from lodestream.eventlog import EventLog, ensure_streams, jetstream
from lodestream.natsconn import connect
from lodestream.schemas.events.job import RetryData
from lodestream.schemas.retry import RetryBackoff, backoff_s
from lodestream.schemas.subjects import EVENTS_STREAM
from tests.fixtures.nats import SecureNats
from tests.integration.test_launcher import control_plane, submit, until_all
from tests.support.builders import job_created, site_registered
from tests.support.processes import TEST_HEARTBEAT_TTL_S, service_env, service_process
from tests.support.projection import running_projector
from tests.support.site import secure_site_dir

SITE, OWNER = "alpha", "ada"
SITE_BACKOFF = {"base_s": 0.1, "factor": 2.0, "max_s": 5.0, "jitter": 0.5}

# An app with its own, smaller budget and its own backoff (base and factor; the rest the site's).
DOOMED_APP = '''
from lodestream.agents.site.apps import ApplicationDefinition


class Doomed(ApplicationDefinition):
    """Always fails."""

    name = "doomed"
    command_template = "echo never {{ tag }} >&2; exit 4"
    retry_budget = 2
    retry_backoff = {"base_s": 0.3, "factor": 3, "jitter": 0}
'''


@dataclass(frozen=True)
class Step:
    type: str
    occurred_at: datetime
    data: dict[str, Any]


async def steps(dsn: str, job_id: uuid.UUID) -> list[Step]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT type, occurred_at, data FROM rm.job_events WHERE job_id = %s ORDER BY seq",
            (job_id,),
        )
        return [Step(t, at, data) for t, at, data in await cursor.fetchall()]


def restarts(history: list[Step]) -> list[tuple[Step, RetryData, Step]]:
    """Each restart with its retry data, the failure it follows and the start that follows it."""
    found = []
    for i, step in enumerate(history):
        if step.type == "job.restart_ready":
            failure, start = history[i - 1], history[i + 1]
            assert failure.type in {"job.run_errored", "job.run_timed_out"}
            assert start.type == "job.started"
            found.append((failure, RetryData.model_validate(step.data), start))
    return found


async def test_an_app_that_always_fails_waits_longer_each_time_then_fails(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    settings = secure_site_dir(
        secure_nats, tmp_path, processing={"retry_budget": 3, "retry_backoff": SITE_BACKOFF}
    )
    (settings.apps_dir / "doomed.py").write_text(DOOMED_APP)
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        own, sites = await submit(js, [
            job_created(SITE, OWNER, app="doomed", workdir="doomed", parameters={"tag": "a"}),
            job_created(SITE, OWNER, app="fails", workdir="fails", parameters={"why": "b"}),
        ])  # fmt: skip
        stop = asyncio.Event()
        agent = asyncio.create_task(run_site_agent(settings.directory, stop=stop))
        pilot = asyncio.create_task(run_launcher(settings.directory, wall_time_min=10, stop=stop))
        await until_all(database_url, [own, sites], "FAILED")
        stop.set()
        await agent
        report = await pilot

    # The app's own rules: 3 attempts in all, waits of 0.3 s then 0.9 s (factor 3, no jitter).
    history = await steps(database_url, own)
    assert [s.type for s in history] == [
        "job.created", "job.preprocessed",
        "job.started", "job.run_errored", "job.restart_ready",
        "job.started", "job.run_errored", "job.restart_ready",
        "job.started", "job.run_errored", "job.failed",
    ]  # fmt: skip
    retries = restarts(history)
    assert [(r.attempt, r.max_attempts, r.backoff_s) for _, r, _ in retries] == [
        (2, 3, 0.3),
        (3, 3, 0.9),
    ]
    for failure, retry, start in retries:
        assert retry.retry_at == failure.occurred_at + timedelta(seconds=retry.backoff_s)
        assert start.occurred_at >= retry.retry_at  # no pilot leased it before it was due
        assert start.data["attempt"] == retry.attempt
    assert "run error on attempt 3 (retry budget exhausted)" in history[-1].data["reason"]

    # The site's rules for an app that sets none: 4 attempts, jittered doubling waits.
    history = await steps(database_url, sites)
    retries = restarts(history)
    policy = RetryBackoff.model_validate(SITE_BACKOFF)
    assert [(r.attempt, r.max_attempts) for _, r, _ in retries] == [(2, 4), (3, 4), (4, 4)]
    waits = [r.backoff_s for _, r, _ in retries]
    assert waits == [backoff_s(policy, sites, attempt) for attempt in (1, 2, 3)]
    assert waits == sorted(waits)  # jitter of one half never undoes a doubling
    for failure, retry, start in retries:
        assert retry.retry_at == failure.occurred_at + timedelta(seconds=retry.backoff_s)
        assert start.occurred_at >= retry.retry_at
    assert "run error on attempt 4 (retry budget exhausted)" in history[-1].data["reason"]
    assert report.deferred >= 1  # the pilot saw a retry before it was due, and handed it back


async def site_consumers_exist(js: JetStreamContext, timeout_s: float = 30) -> None:
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                await js.consumer_info(EVENTS_STREAM, f"launch-{SITE}")
                await js.consumer_info(EVENTS_STREAM, f"process-{SITE}")
                return
            except NotFoundError:
                await asyncio.sleep(0.05)


async def test_a_controller_killed_during_the_wait_still_retries_exactly_once(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    wait_s = 4.0  # long enough for the kill to land inside it
    backoff = {"base_s": wait_s, "factor": 1.0, "max_s": wait_s, "jitter": 0.0}
    settings = secure_site_dir(secure_nats, tmp_path, processing={"retry_backoff": backoff})
    env = service_env(secure_nats.settings(), database_url)
    nc = await connect(secure_nats.settings())
    try:
        js = jetstream(nc)
        await ensure_streams(js, heartbeat_ttl_s=TEST_HEARTBEAT_TTL_S)
        async with running_projector(js, database_url):
            controller = "lodestream.services.controller"
            with service_process(controller, env, tmp_path / "controller-1.log") as first:
                await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
                await site_consumers_exist(js)
                # flaky fails its first attempt and succeeds on its second.
                [job] = await submit(js, [
                    job_created(SITE, OWNER, app="flaky", workdir="f", parameters={"tag": "t"})
                ])  # fmt: skip
                stop_agent, stop_first = asyncio.Event(), asyncio.Event()
                agent = asyncio.create_task(run_site_agent(settings.directory, stop=stop_agent))
                pilot = run_launcher(settings.directory, wall_time_min=10, stop=stop_first)
                first_pilot = asyncio.create_task(pilot)
                await until_all(database_url, [job], "RESTART_READY")
                first.send_signal(signal.SIGKILL)
                await asyncio.to_thread(first.wait)
                killed_at = datetime.now(UTC)
                stop_first.set()  # the pilot that may have seen the retry goes too
                await first_pilot
            with service_process(controller, env, tmp_path / "controller-2.log"):
                stop_second = asyncio.Event()
                second_pilot = asyncio.create_task(
                    run_launcher(settings.directory, wall_time_min=10, stop=stop_second)
                )
                await until_all(database_url, [job], "JOB_FINISHED")
                stop_second.set()
                stop_agent.set()
                report = await second_pilot
                await agent
    finally:
        await nc.close()

    history = await steps(database_url, job)
    assert [s.type for s in history] == [
        "job.created", "job.preprocessed", "job.started", "job.run_errored",
        "job.restart_ready", "job.started", "job.finished",
    ]  # fmt: skip
    [(failure, retry, start)] = restarts(history)
    assert retry.backoff_s == wait_s
    assert retry.retry_at is not None
    assert killed_at < retry.retry_at, "the kill was meant to land inside the wait"
    assert start.occurred_at >= retry.retry_at
    assert report.finished == 1  # a pilot started after the kill ran the retry
    assert failure.data["attempt"] == 1
