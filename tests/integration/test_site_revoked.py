"""A revoked site stops cleanly; a passing refusal, or another site's revocation, stops nothing.

The site is revoked the way the control plane does it: ``site.removed`` on the log (what
``DELETE /sites/<name>`` appends), folded by the projector, applied to nats-server by the
credential sync with a live reload (what ``lode up`` runs every second).
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
from pathlib import Path

import psycopg
import pytest

from lodestream.agents.launcher.main import run as run_launcher
from lodestream.agents.site.credential import EXIT_CREDENTIAL_REVOKED
from lodestream.agents.site.main import run as run_site_agent
from lodestream.eventlog import EventLog
from lodestream.schemas.events import SiteRemoved
from lodestream.schemas.events.site import SiteRegistered, SiteRegisteredData
from lodestream.schemas.ids import derived_id
from lodestream.services.embedded.credentials import CredentialSync
from tests.fixtures.nats import SecureNats
from tests.integration.test_launcher import control_plane, submit, until_all
from tests.integration.test_launcher_faults import spawn, stop
from tests.support.builders import job_created
from tests.support.projection import wait_for_position
from tests.support.site import secure_site_dir

pytestmark = pytest.mark.slow
OWNERS = {"alpha": "ada", "beta": "bob"}
REVOKED = "the site's credential was revoked"
# Heartbeats outlive a refusal of a few seconds, so a passing one expires no session.
TTL_S = 15


def registered(secure: SecureNats, site: str) -> SiteRegistered:
    return SiteRegistered.create(
        site=site, aggregate_id=derived_id("site", site), actor=f"user:{OWNERS[site]}",
        data=SiteRegisteredData(name=site, owner=OWNERS[site], public_key=secure.public_keys[site]),
    )  # fmt: skip


async def apps_published(dsn: str, site: str) -> None:
    """Until the site agent of ``site`` has published its apps: it is connected and working."""
    async with asyncio.timeout(60):
        while True:
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                cursor = await conn.execute("SELECT 1 FROM rm.apps WHERE site = %s", (site,))
                if await cursor.fetchone() is not None:
                    return
            await asyncio.sleep(0.1)


async def exit_code(proc: subprocess.Popen[bytes], timeout_s: float = 60) -> int:
    return await asyncio.to_thread(proc.wait, timeout_s)


async def test_a_removed_site_exits_with_its_own_status_and_other_sites_carry_on(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    sites = {
        # Alpha gives up after 2 s of refusals, to keep the test short.
        "alpha": secure_site_dir(
            secure_nats, tmp_path, nats={"revoked_after_s": 2}, idle_ttl_s=600
        ),
        "beta": secure_site_dir(secure_nats, tmp_path, site="beta", idle_ttl_s=600),
    }
    sync = CredentialSync(secure_nats.server, database_url, secure_nats.user, secure_nats.password)
    logs = {f"{s} {w}": tmp_path / f"{s}-{w}.log" for s in sites for w in ("agent", "launcher")}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    async with control_plane(secure_nats, database_url) as js:
        log = EventLog(js)
        for site in sites:
            await wait_for_position(
                database_url, (await log.append(registered(secure_nats, site), expect=0)).seq
            )
        sync.sync_once()
        try:
            for name, path in logs.items():
                site, what = name.split()
                procs[name] = spawn(what, sites[site], path)
            for site in sites:  # both sites at work: agents connected, pilots running jobs
                await apps_published(database_url, site)
                ids = await submit(js, [job_created(site, OWNERS[site], app="hello")])
                await until_all(database_url, ids, "JOB_FINISHED")

            removed = SiteRemoved.create(
                site="alpha", aggregate_id=derived_id("site", "alpha"), actor="user:ada"
            )
            await wait_for_position(database_url, (await log.append(removed, expect=None)).seq)
            assert sync.sync_once()  # nats-server reloaded without alpha's key

            assert await exit_code(procs["alpha agent"]) == EXIT_CREDENTIAL_REVOKED
            assert await exit_code(procs["alpha launcher"]) == EXIT_CREDENTIAL_REVOKED
            ids = await submit(js, [job_created("beta", "bob", app="hello", workdir="after")])
            await until_all(database_url, ids, "JOB_FINISHED")
            assert procs["beta agent"].poll() is None
            assert procs["beta launcher"].poll() is None
        finally:
            for proc in procs.values():
                stop(proc)
    texts = {name: path.read_text() for name, path in logs.items()}
    for name in ("alpha agent", "alpha launcher"):
        assert REVOKED in texts[name], texts[name]
        assert f"error: site alpha: {REVOKED}" in texts[name].replace("\n", " ")
    for name in ("beta agent", "beta launcher"):
        assert REVOKED not in texts[name]
    assert procs["beta agent"].returncode == 0
    assert procs["beta launcher"].returncode == 0


async def until_logged_times(
    caplog: pytest.LogCaptureFixture, text: str, times: int, timeout_s: float = 30
) -> None:
    async with asyncio.timeout(timeout_s):
        while sum(text in record.getMessage() for record in caplog.records) < times:
            await asyncio.sleep(0.05)


async def test_a_refusal_that_passes_stops_nothing(
    secure_nats: SecureNats, database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The default rule (30 s of refusals); the key comes back within a reload or two.
    caplog.set_level(logging.INFO, logger="lodestream.agents.site.credential")
    site = secure_site_dir(secure_nats, tmp_path, heartbeat_ttl_s=TTL_S, idle_ttl_s=600)
    keys = dict(secure_nats.public_keys)
    async with control_plane(secure_nats, database_url, heartbeat_ttl_s=TTL_S) as js:
        await EventLog(js).append(registered(secure_nats, "alpha"), expect=0)
        stop_all = asyncio.Event()
        agent = asyncio.create_task(run_site_agent(site.directory, stop=stop_all))
        pilot = asyncio.create_task(run_launcher(site.directory, wall_time_min=10, stop=stop_all))
        await apps_published(database_url, "alpha")

        await asyncio.to_thread(secure_nats.set_sites, {"beta": keys["beta"]})
        await until_logged_times(caplog, "NATS refused the site's credential", 2)
        await asyncio.to_thread(secure_nats.set_sites, keys)
        await until_logged_times(caplog, "NATS accepts the site's credential again", 2)

        ids = await submit(js, [job_created("alpha", "ada", app="hello", workdir="back")])
        await until_all(database_url, ids, "JOB_FINISHED")
        assert not agent.done()
        assert not pilot.done()
        stop_all.set()
        await asyncio.wait_for(agent, 30)  # returns: no CredentialRevoked
        report = await asyncio.wait_for(pilot, 30)
    assert report.exit_reason == "stopped"
    assert report.finished == 1
    assert not any(REVOKED in record.getMessage() for record in caplog.records)
