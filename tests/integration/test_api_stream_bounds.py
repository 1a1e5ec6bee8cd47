"""``/events/stream`` against readers that never read: what one connection and one user
may cost the api (real uvicorn on loopback, real NATS and Postgres).

The slow readers are raw sockets with a tiny receive buffer that send their request and
read nothing, so the api's writes soon wait on a full TCP window, the case that once
kept a stream, its consumer and its buffers for as long as the socket stayed open. (A
slow reader that reads late and is told it lagged: ``test_api_stream.py``.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest
from nats.js import JetStreamContext

from lodestream.services.api.main import create_app
from lodestream.settings import StreamSettings
from tests.fixtures.api import ApiHarness, api_client, api_settings, running_projector, served
from tests.fixtures.nats import RunningNats
from tests.integration.test_api_stream import (
    WAIT_S,
    append_apps,
    consumers,
    raw_request,
    read_all,
    read_events,
    wait_for_consumers,
)

LIMIT = 3


@pytest.fixture
async def api(
    nats_server: RunningNats, database_url: str, js: JetStreamContext
) -> AsyncIterator[ApiHarness]:
    # Small outboxes, short patience, and a per-user limit a test can reach.
    stream = StreamSettings(
        queue_size=8,
        queue_bytes=2**12,
        lag_s=0.3,
        lagged_grace_s=0.5,
        heartbeat_s=0.5,
        hub_history_bytes=2**16,
        max_streams_per_user=LIMIT,
    )
    settings = api_settings(nats_server, database_url, max_jobs_per_request=50, stream=stream)
    app = create_app(settings)
    async with running_projector(js, database_url) as projector, api_client(app) as client:
        yield ApiHarness(client, app, settings, js, nats_server, projector)


@pytest.fixture
async def base_url(api: ApiHarness) -> AsyncIterator[str]:
    async with served(api) as url:
        yield url


def held(api: ApiHarness, user: str) -> int:
    return int(api.app.state.feed_slots.held(user))


async def wait_until_held(api: ApiHarness, user: str, count: int) -> None:
    async with asyncio.timeout(WAIT_S):
        while held(api, user) != count:
            await asyncio.sleep(0.02)


async def test_readers_that_never_read_are_let_go_and_the_one_that_reads_gets_every_event(
    api: ApiHarness, base_url: str
) -> None:
    start = await api.register_site("ada", "alpha")
    ada = api.user("ada")
    before = await consumers(api.js)
    port = int(base_url.rsplit(":", 1)[1])
    # One replays the log from its start (since=0), one from where ada's site began.
    stalled = [
        raw_request(port, "/events/stream?since=0", api.tokens["ada"]),
        raw_request(port, f"/events/stream?since={start}", api.tokens["ada"]),
    ]
    try:
        await wait_until_held(api, "ada", 2)  # a hub or consumers of their own: either
        healthy = asyncio.create_task(read_events(base_url, ada, 300))
        await wait_until_held(api, "ada", 3)
        # Some 12 MB of events: far more than the stalled sockets' buffers and outboxes.
        await append_apps(api, 300, padding="x" * 40_000)
        got = await healthy
        assert len(got) == 300, "the reader that keeps up got every event"
        assert [e["seq"] for e in got] == sorted({e["seq"] for e in got})
        # The stalled ones are let go while their sockets are still open: consumers
        # deleted, stream slots freed, nothing of theirs left in a hub.
        await wait_until_held(api, "ada", 0)
        await wait_for_consumers(api.js, before)
        assert api.app.state.feed_hubs.members() == {}
        for sock in stalled:
            sock.setblocking(False)
            received = await read_all(sock)  # it ends: the api closed the connection
            assert received.startswith(b"HTTP/1.1 200 OK")
            assert len(received) < 12_000_000, "cut off, not fed the whole log"
    finally:
        for sock in stalled:
            sock.close()


async def test_streams_past_the_per_user_limit_are_refused_until_one_ends(
    api: ApiHarness, base_url: str
) -> None:
    await api.register_site("ada", "alpha")
    await api.register_site("bob", "beta")
    ada, bob = api.user("ada"), api.user("bob")
    port = int(base_url.rsplit(":", 1)[1])
    # Stalled readers count as much as any: that is what the limit is for.
    stalled = [raw_request(port, "/events/stream", api.tokens["ada"]) for _ in range(LIMIT)]
    try:
        await wait_until_held(api, "ada", LIMIT)
        async with httpx.AsyncClient(base_url=base_url) as client:
            refused = await client.get("/events/stream", headers=ada)
            assert refused.status_code == 429
            error = refused.json()["error"]
            assert error["code"] == "too_many"
            assert "too many open event streams" in error["message"]
            assert error["details"] == {"open": LIMIT, "limit": LIMIT}
            async with client.stream("GET", "/events/stream", headers=bob) as other:
                assert other.status_code == 200, "one user's limit is not another's"
            stalled.pop().close()
            await wait_until_held(api, "ada", LIMIT - 1)
            async with client.stream("GET", "/events/stream", headers=ada) as again:
                assert again.status_code == 200, "a stream that ended made room"
    finally:
        for sock in stalled:
            with contextlib.suppress(OSError):
                sock.close()
    await wait_until_held(api, "ada", 0)
