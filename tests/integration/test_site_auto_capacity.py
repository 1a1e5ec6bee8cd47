"""``fastest_eta`` splits one large request by capacity: three sites, one open pilot each.

Each pilot has the same slots; a warm-up run by name shows the API that ``sleeper`` takes
about 0.05 s at fast, 0.25 s at mid and 1 s at slow. One request of auto jobs then lands
mostly at fast and least at slow, each with its estimate in ``job.created``. The split is
asserted, never a duration: the run times measured on a loaded machine only shift it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from lodestream.agents.launcher.main import run as run_launcher
from lodestream.eventlog import ensure_streams, jetstream
from lodestream.natsconn import connect
from lodestream.schemas.nkey import new_user_seed, user_public_key
from lodestream.schemas.resources import App, AppParameter
from lodestream.services.api.capacity import NO_PILOT_WAIT_S
from lodestream.services.api.main import create_app
from tests.fixtures.api import ApiHarness, api_client, api_settings, running_projector
from tests.fixtures.nats import SecureNats, write_seed
from tests.integration.test_controller import running_controller
from tests.integration.test_launcher import until_all
from tests.support.processes import TEST_HEARTBEAT_TTL_S
from tests.support.site import secure_site_dir

USER = "ada"
SECONDS = {"fast": "0.05", "mid": "0.25", "slow": "1"}  # sleeper's run at each site
WARM_UP = 4  # jobs per site, two waves of its pilot's two slots
AUTO_JOBS = 24


def sleeper(site: str, n: int, seconds: str, **fields: Any) -> dict[str, Any]:
    return {"site": site, "app": "sleeper", "workdir": f"{site}/{n}",
            "parameters": {"seconds": seconds}, **fields}  # fmt: skip


@pytest.fixture
async def api(secure_nats: SecureNats, database_url: str) -> AsyncIterator[ApiHarness]:
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
            yield ApiHarness(client, app, settings, js, secure_nats, projector)
    finally:
        await nc.close()


def credentials(secure: SecureNats, root: Path) -> None:
    """A site key for each of the three sites (the fixture has two), live on the server."""
    keys = {}
    for site in SECONDS:
        seed = new_user_seed()
        secure.seed_files[site] = write_seed(root / f"{site}.nk", seed)
        keys[site] = user_public_key(seed)
    secure.set_sites(keys)


async def test_one_request_splits_by_what_the_open_pilots_can_run(
    api: ApiHarness, secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    await asyncio.to_thread(credentials, secure_nats, tmp_path)
    parameters = {"seconds": AppParameter(required=False, default="0")}
    for site in SECONDS:
        await api.register_site(USER, site)
        await api.register_app(App(site=site, name="sleeper", parameters=parameters))
    stop = asyncio.Event()
    sites = [secure_site_dir(secure_nats, tmp_path, site=site).directory for site in SECONDS]
    pilots = [
        asyncio.create_task(run_launcher(directory, wall_time_min=10, stop=stop))
        for directory in sites
    ]
    try:
        warm = [sleeper(site, n, seconds) for site, seconds in SECONDS.items()
                for n in range(WARM_UP)]  # fmt: skip
        response = await api.submit(USER, warm)
        assert response.status_code == 201, response.text
        warm_ids = [uuid.UUID(job["id"]) for job in response.json()["jobs"]]
        await until_all(database_url, warm_ids, "JOB_FINISHED")

        auto = [sleeper("auto", n, "0", strategy="fastest_eta") for n in range(AUTO_JOBS)]
        response = await api.submit(USER, auto)
        assert response.status_code == 201, response.text
        ids = [uuid.UUID(job["id"]) for job in response.json()["jobs"]]
        split = Counter(job["site"] for job in await jobs_of(api, ids))
        assert split["fast"] > split["mid"] > split["slow"], split

        events = await api.client.get(f"/jobs/{ids[0]}/events", headers=api.user(USER))
        figures = events.json()[0]["data"]["site_choice"]["candidates"]
        rate = {site: f["throughput_per_s"] for site, f in figures.items()}
        assert rate["fast"] > rate["mid"] > rate["slow"], rate
        # Every site has an open pilot: nobody waits for one.
        assert all(f["eta_s"] < NO_PILOT_WAIT_S for f in figures.values()), figures
        await until_all(database_url, ids, "JOB_FINISHED")
    finally:
        stop.set()
        reports = await asyncio.wait_for(asyncio.gather(*pilots), 60)
    assert sum(report.finished for report in reports) == len(SECONDS) * WARM_UP + AUTO_JOBS


async def jobs_of(api: ApiHarness, ids: list[uuid.UUID]) -> list[dict[str, Any]]:
    found = []
    for job_id in ids:
        response = await api.client.get(f"/jobs/{job_id}", headers=api.user(USER))
        assert response.status_code == 200, response.text
        found.append(response.json())
    return found
