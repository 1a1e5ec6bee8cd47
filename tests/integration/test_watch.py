"""The live subscription client against a real nats-server over wss, with a monitoring key."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import warnings
from datetime import UTC, datetime, timedelta

import pytest
from nats.js import JetStreamContext

from lodestream.client.credential import MonitorCredential
from lodestream.client.errors import CredentialRevoked, WatchError, WatchNotice
from lodestream.client.watch import Watch, Watched, watch, watch_sync
from lodestream.eventlog.jetstream import jetstream
from lodestream.eventlog.streams import ensure_streams
from lodestream.natsconn import connect
from lodestream.settings import NatsSettings
from tests.fixtures.nats import SecureNats
from tests.support.processes import TEST_HEARTBEAT_TTL_S
from tests.support.proxy import CutProxy
from tests.support.stack import run_async
from tests.support.watching import append_jobs, apply_monitors, monitor_for

pytestmark = pytest.mark.filterwarnings("ignore::lodestream.client.errors.WatchNotice")


async def take(w: Watch, count: int, timeout_s: float = 20.0) -> list[Watched]:
    got: list[Watched] = []
    async with asyncio.timeout(timeout_s):
        async with w:
            async for item in w:
                got.append(item)
                if len(got) == count:
                    break
    return got


@pytest.fixture
def secure_js(secure_nats: SecureNats, js: JetStreamContext) -> JetStreamContext:
    return js


@pytest.fixture
def nats_settings(secure_nats: SecureNats) -> NatsSettings:
    # The ``js`` fixture connects here: the secure server's control plane (plain listener).
    return secure_nats.settings()


async def test_replay_delivers_own_site_only_in_order(
    secure_nats: SecureNats, secure_js: JetStreamContext
) -> None:
    alpha = await append_jobs(secure_js, "alpha", 4)
    await append_jobs(secure_js, "beta", 4)
    credential = monitor_for(secure_nats, ["alpha"])
    w = watch(credential, ["alpha"], since=1)
    got = await take(w, len(alpha))
    assert [g.seq for g in got] == alpha
    assert {g.site for g in got} == {"alpha"}
    assert got[0].event.type == "job.created"
    assert w.refused == 0


async def test_resume_after_killed_connection_has_no_gap_and_no_duplicate(
    secure_nats: SecureNats, secure_js: JetStreamContext
) -> None:
    before = await append_jobs(secure_js, "alpha", 6)
    credential = monitor_for(secure_nats, ["alpha"])
    port = secure_nats.server.config.websocket_port
    assert port is not None
    async with CutProxy(port) as proxy:
        url = credential.nats_url.replace(f":{port}", f":{proxy.port}")
        w = watch(dataclasses.replace(credential, nats_url=url), ["alpha"], since=1)
        got: list[Watched] = []
        async with asyncio.timeout(60):
            iterator = aiter(w)
            while len(got) < 10:
                got.append(await anext(iterator))
            await proxy.cut()
            during = await append_jobs(secure_js, "alpha", 4)  # appended while it is cut off
            await proxy.restore()
            after = await append_jobs(secure_js, "alpha", 2)
            expected = before + during + after
            while len(got) < len(expected):
                got.append(await anext(iterator))
        await w.close()
    assert [g.seq for g in got] == expected  # every sequence once, in order
    assert w.resumes >= 1


async def test_since_last_seq_plus_one_continues_exactly(
    secure_nats: SecureNats, secure_js: JetStreamContext
) -> None:
    seqs = await append_jobs(secure_js, "alpha", 4)
    credential = monitor_for(secure_nats, ["alpha"])
    first = await take(watch(credential, ["alpha"], since=1), 7)
    more = await append_jobs(secure_js, "alpha", 1)
    rest = await take(watch(credential, ["alpha"], since=first[-1].seq + 1), 13 + 5)
    assert [g.seq for g in first + rest] == seqs + more


async def test_since_now_and_since_time(
    secure_nats: SecureNats, secure_js: JetStreamContext
) -> None:
    before = await append_jobs(secure_js, "alpha", 2)
    credential = monitor_for(secure_nats, ["alpha"])
    async with watch(credential, ["alpha"], since="now") as w:
        assert w.positions == {"alpha": before[-1] + 1}  # "now", as a sequence
        new = await append_jobs(secure_js, "alpha", 1)
        assert [g.seq for g in await take(w, 5)] == new
    later = datetime.now(UTC) + timedelta(hours=1)
    async with watch(credential, ["alpha"], since=later) as w:
        assert w.positions == {"alpha": new[-1] + 1}


def test_sync_wrapper(secure_nats: SecureNats) -> None:
    credential = monitor_for(secure_nats, ["alpha"])

    async def seed() -> list[int]:
        nc = await connect(secure_nats.settings())
        try:
            js = jetstream(nc)
            await ensure_streams(js, heartbeat_ttl_s=TEST_HEARTBEAT_TTL_S)
            return await append_jobs(js, "alpha", 2)
        finally:
            await nc.close()

    seqs = run_async(seed)
    got = []
    for item in watch_sync(credential, ["alpha"], since=1):
        got.append(item.seq)
        if len(got) == len(seqs):
            break
    assert got == seqs
    # Leaving the loop while the watch waits for more ends its thread and its connection.
    assert not [t for t in threading.enumerate() if t.name == "lode-watch" and t.is_alive()]


async def test_filters(secure_nats: SecureNats, secure_js: JetStreamContext) -> None:
    await append_jobs(secure_js, "alpha", 3)
    credential = monitor_for(secure_nats, ["alpha"])
    finished = await take(watch(credential, ["alpha"], since=1, types=["job.finished"]), 3)
    assert [g.event.type for g in finished] == ["job.finished"] * 3
    one = finished[1].event.aggregate_id
    mine = await take(watch(credential, ["alpha"], since=1, jobs=[str(one)]), 5)
    assert {g.event.aggregate_id for g in mine} == {one}


async def test_bad_input_is_refused_with_clear_messages(
    secure_nats: SecureNats, secure_js: JetStreamContext
) -> None:
    credential = monitor_for(secure_nats, ["alpha"])
    with pytest.raises(WatchError, match=r"unknown event type.*'job\.exploded'"):
        watch(credential, ["alpha"], types=["job.exploded"])
    with pytest.raises(WatchError, match="job id must be a UUID"):
        watch(credential, ["alpha"], jobs=["not-a-uuid"])
    with pytest.raises(WatchError, match="invalid site name"):
        watch(credential, ["Alpha!"])
    with pytest.raises(WatchError, match=r"beyond the end of the log.*last sequence is 10"):
        watch(credential, ["alpha"], since=50, log_end=10)
    with pytest.raises(WatchError, match="time zone"):
        watch(credential, ["alpha"], since=datetime(2026, 1, 1))  # noqa: DTZ001
    # A site the key does not hold: the server refuses the consumer, the watch says so.
    with pytest.raises(WatchError, match="cannot watch site 'beta'"):
        await take(watch(credential, ["beta"], since=1), 1, timeout_s=30)


async def test_revoked_credential_is_told(
    secure_nats: SecureNats, secure_js: JetStreamContext
) -> None:
    credential = monitor_for(secure_nats, ["alpha"])
    stranger = MonitorCredential.new(credential.nats_url, credential.ca_file)
    with pytest.raises(CredentialRevoked, match="refused the monitoring credential"):
        await take(watch(stranger, ["alpha"], since=1), 1)
    # Revoked while watching: the server drops the connection, the watch ends with the reason.
    w = watch(credential, ["alpha"], since="now")
    async with w:
        apply_monitors(secure_nats, [])
        with pytest.raises(CredentialRevoked):
            await take(w, 1, timeout_s=30)


async def test_slow_consumer_is_told_and_resumes(
    secure_nats: SecureNats, secure_js: JetStreamContext
) -> None:
    """A caller that stops pulling for longer than the server keeps its consumer: the server
    drops it (and holds nothing for it); the watch says so and goes on where it was."""
    seqs = await append_jobs(secure_js, "alpha", 4)
    credential = monitor_for(secure_nats, ["alpha"])
    w = watch(credential, ["alpha"], since=1, inactive_s=1.0)
    iterator = aiter(w)
    got = [await anext(iterator)]
    await asyncio.sleep(3.0)  # the caller is busy; the server deletes the idle consumer
    more = await append_jobs(secure_js, "alpha", 1)
    with warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always", WatchNotice)
        async with asyncio.timeout(30):
            while len(got) < len(seqs + more):
                got.append(await anext(iterator))
    await w.close()
    assert [g.seq for g in got] == seqs + more
    assert w.resumes >= 1
    assert any(issubclass(t.category, WatchNotice) for t in told)
