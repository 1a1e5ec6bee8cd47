"""/readyz reports each dependency and the projector's lag; 503 while NATS is down."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.fixtures.api import ApiHarness


async def readiness(api: ApiHarness) -> tuple[int, dict[str, Any]]:
    response = await api.client.get("/readyz")
    return response.status_code, response.json()


async def test_ready_with_the_projector_caught_up(api: ApiHarness) -> None:
    seq = await api.register_site("alice", "theta")

    status, report = await readiness(api)

    assert status == 200
    assert report["ready"] is True
    assert report["nats"]["ok"]
    assert report["postgres"]["ok"]
    assert report["projector"] == {"stream_last_seq": seq, "position": seq, "lag": 0}


async def test_lag_counts_events_the_projector_has_not_applied(api: ApiHarness) -> None:
    await api.register_site("alice", "theta")
    await api.projector.stop()
    jobs = [{"site": "theta", "app": "sim", "workdir": f"w/{i}"} for i in range(3)]
    await api.client.post("/jobs", json={"jobs": jobs}, headers=api.user("alice"))

    status, report = await readiness(api)

    assert status == 200  # lag is reported, not judged: a rebuild or a burst is not an outage
    assert report["projector"]["lag"] == 3

    api.projector.start()
    await api.wait_projected(report["projector"]["stream_last_seq"])
    assert (await readiness(api))[1]["projector"]["lag"] == 0


async def test_not_ready_while_nats_is_down(api: ApiHarness) -> None:
    await api.projector.stop()
    api.nats.server.stop()
    try:
        status, report = await readiness(api)

        assert status == 503
        assert report["ready"] is False
        assert report["nats"]["ok"] is False
        assert report["postgres"]["ok"] is True
        assert report["projector"]["lag"] is None
    finally:
        api.nats.server.start()
    async with asyncio.timeout(20):
        while (await readiness(api))[0] != 200:
            await asyncio.sleep(0.1)


async def test_an_append_while_nats_is_down_is_unavailable(api: ApiHarness) -> None:
    await api.projector.stop()
    headers = api.user("alice")
    api.nats.server.stop()
    try:
        response = await api.client.post("/sites", json={"name": "theta"}, headers=headers)
    finally:
        api.nats.server.start()

    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "unavailable"
    assert error["message"] == "the event log is unavailable, retry later"
