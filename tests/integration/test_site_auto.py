"""``site: "auto"`` end to end: three sites of one user that ran at different speeds.

alpha's pilot has just finished 12 jobs, beta's 3, gamma has no pilot (nothing measured);
those pilots have closed since. Real pilots over wss ran them; the API then reads each
site's backlog, run times and open pilots from the read models the projector folded, and
each strategy's jobs land where its rule says, with the figures in their ``job.created``.
(With open pilots of unequal speed: test_site_auto_capacity.py.)
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from lodestream.agents.launcher.main import run as run_launcher
from lodestream.eventlog import ensure_streams, jetstream
from lodestream.natsconn import connect
from lodestream.schemas.resources import App, AppParameter
from lodestream.services.api.capacity import NO_PILOT_WAIT_S
from lodestream.services.api.main import create_app
from tests.fixtures.api import ApiHarness, api_client, api_settings, running_projector
from tests.fixtures.nats import SecureNats
from tests.integration.test_controller import running_controller
from tests.integration.test_launcher import until_all
from tests.support.processes import TEST_HEARTBEAT_TTL_S
from tests.support.site import secure_site_dir

USER = "ada"
SITES = ("alpha", "beta", "gamma")
RAN = {"alpha": 12, "beta": 3}  # jobs each site's pilot finishes before the auto submissions


@dataclass
class Federation:
    api: ApiHarness
    dsn: str

    async def submit(self, jobs: list[dict[str, Any]]) -> httpx.Response:
        return await self.api.submit(USER, jobs)

    async def placed(self, jobs: list[dict[str, Any]]) -> list[tuple[str, str]]:
        """Submit ``jobs``; each one's id and the site it is at, as the read model has it."""
        response = await self.submit(jobs)
        assert response.status_code == 201, response.text
        placed = []
        for job in response.json()["jobs"]:
            got = await self.api.client.get(f"/jobs/{job['id']}", headers=self.api.user(USER))
            placed.append((job["id"], got.json()["site"]))
        return placed

    async def choice(self, job_id: str) -> dict[str, Any]:
        events = await self.api.client.get(f"/jobs/{job_id}/events", headers=self.api.user(USER))
        created = events.json()[0]
        assert created["type"] == "job.created"
        choice: dict[str, Any] = created["data"]["site_choice"]
        return choice


def hello(site: str, n: int, **fields: Any) -> dict[str, Any]:
    return {"site": site, "app": "hello", "workdir": f"{site}/{n}", **fields}


@pytest.fixture
async def federation(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> AsyncIterator[Federation]:
    nc = await connect(secure_nats.settings())
    js = jetstream(nc)
    await ensure_streams(js, heartbeat_ttl_s=TEST_HEARTBEAT_TTL_S)
    settings = api_settings(secure_nats, database_url)
    app = create_app(settings)
    try:
        async with (
            running_projector(js, database_url) as projector,
            running_controller(js, database_url),
            api_client(app) as client,
        ):
            api = ApiHarness(client, app, settings, js, secure_nats, projector)
            for site in SITES:
                await api.register_site(USER, site)
                for name in ("hello", "sleeper"):
                    parameters = {"who": AppParameter(required=False, default="world")}
                    await api.register_app(
                        App(site=site, name=name, parameters=parameters if name == "hello" else {})
                    )
            federation = Federation(api, database_url)
            for site, count in RAN.items():
                await run_jobs(federation, tmp_path, secure_nats, site, count)
            yield federation
    finally:
        await nc.close()


async def run_jobs(
    federation: Federation, root: Path, secure: SecureNats, site: str, count: int
) -> None:
    """``count`` jobs submitted to ``site`` by name, run to the end by a real pilot there."""
    response = await federation.submit([hello(site, n) for n in range(count)])
    assert response.status_code == 201, response.text
    ids = [uuid.UUID(job["id"]) for job in response.json()["jobs"]]
    settings = secure_site_dir(secure, root, site=site)
    stop = asyncio.Event()
    pilot = asyncio.create_task(run_launcher(settings.directory, wall_time_min=10, stop=stop))
    await until_all(federation.dsn, ids, "JOB_FINISHED")
    stop.set()
    report = await asyncio.wait_for(pilot, 30)
    assert report.finished == count


async def test_each_strategy_routes_by_its_figures(federation: Federation) -> None:
    # fastest_eta: no site has an open pilot now, so each waits for one of one slot and
    # then runs hello in its measured time (gamma: in the time measured at alpha and beta).
    [(job_id, site)] = await federation.placed([hello("auto", 0, strategy="fastest_eta")])
    choice = await federation.choice(job_id)
    figures = choice["candidates"]
    assert (choice["strategy"], site) == ("fastest_eta", choice["chosen"])
    assert site == min(sorted(figures), key=lambda name: figures[name]["eta_s"])
    for name in SITES:
        run_s = 1 / figures[name]["throughput_per_s"]  # one slot
        assert figures[name]["eta_s"] == pytest.approx(NO_PILOT_WAIT_S + run_s)
        assert 0 < run_s < 30

    # shortest_backlog: that job waits where fastest_eta put it (no pilot now; which site that
    # is depends on the run times measured above); give beta a backlog of 3.
    assert await federation.submit([hello("beta", 10 + n) for n in range(3)])
    expected = {"alpha": 0, "beta": 3, "gamma": 0}
    expected[site] += 1
    placed = await federation.placed([hello("auto", n) for n in (1, 2)])  # the default strategy
    choice = await federation.choice(placed[0][0])
    assert choice["strategy"] == "shortest_backlog"
    backlog = {name: figures["backlog"] for name, figures in choice["candidates"].items()}
    assert backlog == expected
    assert placed[0][1] == min(sorted(expected), key=lambda name: expected[name])
    assert "beta" not in {placed_site for _, placed_site in placed}  # the longest backlog

    # round_robin: no site holds a sleeper job yet, so they go round, across requests too.
    sleepers = [{"site": "auto", "app": "sleeper", "workdir": f"s/{n}",
                 "strategy": "round_robin"} for n in range(7)]  # fmt: skip
    first = await federation.placed(sleepers[:5])
    second = await federation.placed(sleepers[5:])
    assert [site for _, site in first + second] == [*SITES, *SITES, "alpha"]


async def test_auto_without_a_site_defining_the_app_is_a_clear_422(
    federation: Federation,
) -> None:
    response = await federation.submit([{"site": "auto", "app": "nope", "workdir": "w"}])
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert "none of your sites defines app 'nope' (your sites: alpha, beta, gamma)" in message
    # Another user's sites are never candidates: bob has none.
    response = await federation.api.submit("bob", [hello("auto", 0)])
    assert response.status_code == 422
    assert "(your sites: none)" in response.json()["error"]["message"]
    # And no site may take the name that means "choose one".
    response = await federation.api.client.post(
        "/sites", json={"name": "auto"}, headers=federation.api.user(USER)
    )
    assert response.status_code == 422
    assert "'auto' is reserved" in response.text
