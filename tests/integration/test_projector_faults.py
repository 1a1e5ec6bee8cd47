"""Fault injection: the projector is SIGKILLed mid-stream and restarted."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from lodestream.eventlog import Appended, EventLog
from lodestream.schemas.envelope import Event
from lodestream.services.projector.rebuild import Rebuild
from lodestream.settings import NatsSettings
from tests.support.builders import job_created, lifecycle, site_registered
from tests.support.processes import service_env, service_process
from tests.support.projection import position, table_digest, wait_for_position

pytestmark = pytest.mark.slow

JOBS = 3000  # 15,001 events: several hundred batches, so the kill lands mid-stream


async def test_projector_killed_mid_stream_loses_and_duplicates_nothing(
    js: JetStreamContext, nats_settings: NatsSettings, database_url: str, tmp_path: Path
) -> None:
    events: list[Event] = [site_registered("alpha", "ada")]
    for _ in range(JOBS):
        created = job_created("alpha", "ada")
        events += [created, *lifecycle(created)]
    results = await EventLog(js).append_many([(e, None) for e in events])
    assert all(isinstance(r, Appended) for r in results)
    last = len(events)

    env = service_env(nats_settings, database_url)
    with service_process("lodestream.services.projector", env, tmp_path / "p1.log") as first:
        async with asyncio.timeout(120):
            while (applied := await position(database_url)) < last // 3:
                await asyncio.sleep(0.02)
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert applied < last, "the kill must land before the projector caught up"

    with service_process("lodestream.services.projector", env, tmp_path / "p2.log"):
        await wait_for_position(database_url, last, timeout_s=180)
    after_crash = await table_digest(database_url)

    assert after_crash["jobs"][0] == JOBS
    assert after_crash["job_events"][0] == JOBS * 5
    assert after_crash["quarantine"][0] == 0
    # A fold from sequence 1 is the ground truth: the crash left exactly those rows.
    await Rebuild(js, database_url).run()
    assert await table_digest(database_url) == after_crash
