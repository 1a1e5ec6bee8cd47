"""``/events/stream`` over real HTTP (uvicorn on loopback), real NATS and Postgres.

Resume from ``Last-Event-ID``, scoping to the caller's sites, refusals of bad input, a
slow client told it lagged, and consumers released when clients go; and the dashboard's
login cookie, which only the read-only routes accept.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from nats.js import JetStreamContext

from lodestream.eventlog import EventLog
from lodestream.schemas.codec import encode
from lodestream.schemas.events.app import AppRegistered
from lodestream.schemas.ids import uuid7
from lodestream.schemas.resources import App
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.services.api.main import create_app
from lodestream.services.api.users import revoke_tokens
from lodestream.settings import StreamSettings
from tests.fixtures.api import ApiHarness, api_client, api_settings, running_projector, served
from tests.fixtures.nats import RunningNats

WAIT_S = 20.0


@pytest.fixture
async def api(
    nats_server: RunningNats, database_url: str, js: JetStreamContext
) -> AsyncIterator[ApiHarness]:
    # A tiny queue and a short patience, so a stalled client lags within the test.
    stream = StreamSettings(queue_size=8, lag_s=0.3, heartbeat_s=0.5, hub_history_bytes=2**16)
    settings = api_settings(nats_server, database_url, max_jobs_per_request=50, stream=stream)
    app = create_app(settings)
    async with running_projector(js, database_url) as projector, api_client(app) as client:
        yield ApiHarness(client, app, settings, js, nats_server, projector)


@pytest.fixture
async def base_url(api: ApiHarness) -> AsyncIterator[str]:
    async with served(api) as url:
        yield url


async def read_events(
    url: str, headers: dict[str, str], count: int, **params: Any
) -> list[dict[str, Any]]:
    """The first ``count`` events of a stream (ids checked against the seq in the data)."""
    events: list[dict[str, Any]] = []
    async with (
        asyncio.timeout(WAIT_S),
        httpx.AsyncClient(base_url=url) as client,
        client.stream("GET", "/events/stream", headers=headers, params=params) as response,
    ):
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        event_id = None
        async for line in response.aiter_lines():
            if line.startswith("id: "):
                event_id = int(line[4:])
            elif line.startswith("data: "):
                event = orjson.loads(line[6:])
                assert event["seq"] == event_id
                events.append(event)
                if len(events) == count:
                    break
    return events


async def consumers(js: JetStreamContext) -> int:
    return int((await js.stream_info(EVENTS_STREAM)).state.consumer_count)


def job(n: int, site: str = "alpha") -> dict[str, Any]:
    return {"site": site, "app": "sim", "workdir": f"runs/{n}"}


async def test_the_feed_resumes_from_last_event_id_with_only_the_callers_sites(
    api: ApiHarness, base_url: str
) -> None:
    start = await api.register_site("ada", "alpha")
    await api.register_site("bob", "beta")
    await api.register_app(App(site="alpha", name="sim"))
    await api.register_app(App(site="beta", name="sim"))
    assert (await api.submit("ada", [job(n) for n in range(3)])).status_code == 201
    assert (await api.submit("bob", [job(9, "beta")])).status_code == 201
    ada = api.user("ada")

    first = await read_events(base_url, ada, 3, since=start - 1)
    assert [e["type"] for e in first] == ["site.registered", "app.registered", "job.created"]
    assert first[0]["seq"] == start
    assert (await api.submit("ada", [job(n) for n in range(3, 5)])).status_code == 201

    # What an EventSource sends on reconnect; it wins over the since= of the original URL.
    resumed = await read_events(
        base_url, {**ada, "Last-Event-ID": str(first[-1]["seq"])}, 4, since=0
    )
    seqs = [e["seq"] for e in first + resumed]
    assert seqs == sorted(set(seqs)), "no event twice, in log order"
    assert {e["site"] for e in first + resumed} == {"alpha"}, "never another user's site"
    assert [e["type"] for e in resumed] == ["job.created"] * 4

    # Job ids and types narrow the same feed.
    one = resumed[-1]["aggregate_id"]
    only = await read_events(base_url, ada, 1, since=start, job=one, type="job.created")
    assert [e["aggregate_id"] for e in only] == [one]


@pytest.mark.parametrize(
    ("params", "headers", "status", "message"),
    [
        ({"sites": "alpha"}, {}, 422, "unknown filter 'sites'"),
        ({"kind": "jobs"}, {}, 422, "unknown kind 'jobs'"),
        ({"type": "job.done"}, {}, 422, "unknown event type 'job.done'"),
        ({"job": "nope"}, {}, 422, "a job filter must be a job id"),
        ({"site": "beta"}, {}, 404, "site 'beta' not found"),
        ({"since": "99999999"}, {}, 422, "beyond the end of the event log"),
        ({}, {"Last-Event-ID": "99999999"}, 422, "Last-Event-ID 99999999 is beyond the end"),
        ({}, {"Last-Event-ID": "x1"}, 422, "must be a stream sequence"),
    ],
)
async def test_bad_requests_are_refused_clearly(
    api: ApiHarness,
    params: dict[str, str],
    headers: dict[str, str],
    status: int,
    message: str,
) -> None:
    await api.register_site("ada", "alpha")
    await api.register_site("bob", "beta")
    response = await api.client.get(
        "/events/stream", params=params, headers={**api.user("ada"), **headers}
    )
    assert response.status_code == status, response.text
    assert message in response.json()["error"]["message"]
    assert (await api.client.get("/events/stream")).status_code == 401


def raw_request(port: int, path: str, token: str) -> socket.socket:
    """A client that sends one request and then reads nothing: a tiny receive buffer."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        f"GET {path} HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
    )
    return sock


async def test_a_stalled_client_is_told_it_lagged_and_releases_its_consumer(
    api: ApiHarness, base_url: str
) -> None:
    start = await api.register_site("ada", "alpha")
    api.user("ada")
    before = await consumers(api.js)
    port = int(base_url.rsplit(":", 1)[1])
    sock = raw_request(port, f"/events/stream?since={start}", api.tokens["ada"])
    try:
        async with asyncio.timeout(WAIT_S):
            while await consumers(api.js) == before:
                await asyncio.sleep(0.02)
        # Some 12 MB of events: far more than the socket buffers and the queue hold.
        log = EventLog(api.js)
        padding = "x" * 40_000
        for n in range(300):
            app = App(site="alpha", name=f"app{n}", description=padding)
            event = AppRegistered.create(
                site="alpha", aggregate_id=uuid7(), actor="site:alpha", data=app
            )
            await log.append(event, expect=None)
        await asyncio.sleep(1.0)  # longer than lag_s: the api gives up on this client
        sock.setblocking(False)
        received = await read_all(sock)
    finally:
        sock.close()
    text = received.decode(errors="replace")
    assert "event: lagged" in text, text[-500:]
    ids = [int(line[4:]) for line in text.splitlines() if line.startswith("id: ")]
    found = re.search(r"event: lagged\ndata: (\{.*?\})\n", text)
    assert found is not None, text[-500:]
    lagged = orjson.loads(found.group(1))
    assert lagged["last_seq"] == ids[-1], "lagged names the last event it was sent"
    assert ids[-1] < start + 300, "it was cut off before the end, not fed everything"
    async with asyncio.timeout(WAIT_S):
        while await consumers(api.js) != before:
            await asyncio.sleep(0.05)


async def read_all(
    sock: socket.socket, until: bytes | None = None, wait_s: float = WAIT_S
) -> bytes:
    """Everything the server sent until it closed the connection (or sent ``until``)."""
    loop = asyncio.get_running_loop()
    chunks: list[bytes] = []
    async with asyncio.timeout(wait_s):
        while chunk := await loop.sock_recv(sock, 1 << 16):
            chunks.append(chunk)
            if until is not None and until in b"".join(chunks[-2:]):
                break
    return b"".join(chunks)


async def test_a_client_that_goes_releases_its_consumer(api: ApiHarness, base_url: str) -> None:
    await api.register_site("ada", "alpha")
    before = await consumers(api.js)
    headers = api.user("ada")
    async with httpx.AsyncClient(base_url=base_url) as client:
        for _ in range(3):
            async with client.stream("GET", "/events/stream", headers=headers) as response:
                assert response.status_code == 200
                lines = response.aiter_lines()
                assert (await anext(lines)).startswith("retry: ")
                assert await consumers(api.js) == before + 1
    async with asyncio.timeout(WAIT_S):
        while await consumers(api.js) != before:
            await asyncio.sleep(0.05)


async def test_dashboard_cookie_is_read_only_and_ends_with_its_token(
    api: ApiHarness, base_url: str
) -> None:
    start = await api.register_site("ada", "alpha")
    await api.register_app(App(site="alpha", name="sim"))
    assert (await api.submit("ada", [job(n) for n in range(2)])).status_code == 201
    page = await api.client.get("/ui")
    assert page.status_code == 200
    assert "script-src 'self'" in page.headers["content-security-policy"]
    for name in ("dashboard.js", "dashboard.css"):
        assert (await api.client.get(f"/ui/static/{name}")).status_code == 200
    assert (await api.client.get("/ui/static/..%2Fmain.py")).status_code == 404

    token = api.tokens["ada"]
    refused = await api.client.post("/ui/session", json={"token": "not-a-token"})
    assert refused.status_code == 401
    async with httpx.AsyncClient(base_url=base_url) as browser:
        login = await browser.post("/ui/session", json={"token": token})
        assert login.status_code == 204
        cookie = login.headers["set-cookie"]
        assert "HttpOnly" in cookie
        assert "SameSite=strict" in cookie
        assert token not in cookie
        summary = (await browser.get("/ui/api/summary")).json()
        assert summary["user"] == "ada"
        assert sum(summary["counts"]["alpha"].values()) == 2
        assert summary["position"] >= start
        jobs = (await browser.get("/ui/api/jobs", params={"site": "alpha"})).json()
        assert len(jobs) == 2
        history = (await browser.get(f"/ui/api/jobs/{jobs[0]['id']}/events")).json()
        assert history[0]["type"] == "job.created"
        async with browser.stream("GET", "/events/stream", params={"since": start}) as stream:
            assert stream.status_code == 200
        # The cookie is no bearer token: routes that take one do not accept it.
        assert (await browser.get("/jobs")).status_code == 401
        assert (await browser.post("/jobs", json={"jobs": [job(7)]})).status_code == 401
        # Revoking the token ends the session at once.
        revoke_tokens(api.settings.database_url, "ada")
        gone = await browser.get("/ui/api/summary")
        assert gone.status_code == 401
        assert "revoked" in gone.json()["error"]["message"]
    with contextlib.suppress(KeyError):
        del api.tokens["ada"]


async def append_apps(api: ApiHarness, count: int, site: str = "alpha", padding: str = "") -> None:
    log = EventLog(api.js)
    for n in range(count):
        app = App(site=site, name=f"app{n}", description=padding)
        event = AppRegistered.create(
            site=site, aggregate_id=uuid7(), actor=f"site:{site}", data=app
        )
        await log.append(event, expect=None)


async def wait_for_consumers(js: JetStreamContext, count: int, wait_s: float = WAIT_S) -> None:
    async with asyncio.timeout(wait_s):
        while await consumers(js) != count:
            await asyncio.sleep(0.02)


async def test_clients_of_one_filter_at_the_live_edge_share_one_consumer(
    api: ApiHarness, base_url: str
) -> None:
    await api.register_site("ada", "alpha")
    ada = api.user("ada")
    before = await consumers(api.js)
    readers = [asyncio.create_task(read_events(base_url, ada, 30)) for _ in range(3)]
    await wait_for_consumers(api.js, before + 1)
    # Another filter is another hub: its subjects differ.
    narrow = asyncio.create_task(read_events(base_url, ada, 30, kind="app"))
    await wait_for_consumers(api.js, before + 2)
    await asyncio.sleep(0.3)  # every reader has joined its hub before the events come
    assert await consumers(api.js) == before + 2, "three readers, two filters, two consumers"
    await append_apps(api, 30)
    results = await asyncio.gather(*readers, narrow)
    seqs = [[e["seq"] for e in events] for events in results]
    assert all(s == seqs[0] for s in seqs), "every reader got the same events"
    assert seqs[0] == sorted(set(seqs[0]))
    assert len(seqs[0]) == 30
    await wait_for_consumers(api.js, before)


async def test_a_client_resuming_from_far_back_catches_up_then_shares_the_hub(
    api: ApiHarness, base_url: str
) -> None:
    start = await api.register_site("ada", "alpha")
    ada = api.user("ada")
    await append_apps(api, 40)  # five times what the fixture's outbox holds
    before = await consumers(api.js)
    live = asyncio.create_task(read_events(base_url, ada, 20))
    await wait_for_consumers(api.js, before + 1)
    # From far back: its own consumer first, beside the hub.
    behind = asyncio.create_task(read_events(base_url, ada, 60, since=start))
    async with asyncio.timeout(WAIT_S):
        while await consumers(api.js) != before + 1 or not behind_started(api):
            await asyncio.sleep(0.02)
    await append_apps(api, 20)
    caught_up, at_edge = await asyncio.gather(behind, live)
    seqs = [e["seq"] for e in caught_up]
    assert seqs == sorted(set(seqs)), "no event twice, in log order"
    assert len(seqs) == 60
    assert seqs[0] == start + 1, "no gap across the switch to the hub"
    assert [e["seq"] for e in at_edge] == seqs[-20:]
    await wait_for_consumers(api.js, before)


def behind_started(api: ApiHarness) -> bool:
    # The resuming client has read everything it was behind and joined the hub.
    return 2 in api.app.state.feed_hubs.members().values()


async def test_a_stalled_client_does_not_hold_up_the_others_of_its_hub(
    api: ApiHarness, base_url: str
) -> None:
    start = await api.register_site("ada", "alpha")
    ada = api.user("ada")
    before = await consumers(api.js)
    port = int(base_url.rsplit(":", 1)[1])
    stalled = raw_request(port, f"/events/stream?since={start}", api.tokens["ada"])
    try:
        await wait_for_consumers(api.js, before + 1)
        fast = asyncio.create_task(read_events(base_url, ada, 300))
        await asyncio.sleep(0.3)
        # Some 12 MB of events: more than the stalled client's socket buffers and outbox.
        await append_apps(api, 300, padding="x" * 40_000)
        got = await fast
        assert len(got) == 300, "the reader that keeps up got every event"
        stalled.setblocking(False)
        # Megabytes were buffered for it on a machine that may be busy: read to the notice.
        lagged = await read_all(stalled, until=b"event: lagged", wait_s=3 * WAIT_S)
        received = lagged.decode(errors="replace")
    finally:
        stalled.close()
    assert "event: lagged" in received, "the stalled one was handed back, then told it lagged"
    # The reader that kept up closed after its 300 events: the api learns it at its next
    # write, a heartbeat at the latest (heartbeat_s, 15 s), on a machine that may be busy.
    await wait_for_consumers(api.js, before, wait_s=3 * WAIT_S)


async def test_garbled_and_forged_events_are_skipped_counted_and_the_feed_goes_on(
    api: ApiHarness, base_url: str
) -> None:
    await api.register_site("ada", "alpha")
    ada = api.user("ada")
    before = await consumers(api.js)
    reader = asyncio.create_task(read_events(base_url, ada, 1))
    await wait_for_consumers(api.js, before + 1)
    await asyncio.sleep(0.3)  # the reader has joined its hub
    cache = api.app.state.feed_hubs.cache
    refused_before = cache.refused
    job = uuid7()
    await api.js.publish(f"evt.alpha.job.{job}.created", b"{not json")
    # Well-formed, but about another site than its subject says.
    app = App(site="beta", name="x")
    forged = AppRegistered.create(site="beta", aggregate_id=job, actor="site:beta", data=app)
    await api.js.publish(f"evt.alpha.app.{job}.registered", encode(forged))
    await append_apps(api, 1)
    (event,) = await reader
    assert event["type"] == "app.registered"
    assert event["site"] == "alpha"
    assert cache.refused == refused_before + 2
