"""No binding holds the credential sync back (issue 29, finding 3).

A key bound twice used to make nats-server refuse the whole authorization: a new site never
connected and a removed one stayed connected. Here the duplicates are forced past the API
(rows written straight into the tables), and the real nats-server shows that every other
change still takes effect, while the bad binding is left out and reported.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
import pytest
from nats.aio.client import Client

from lodestream.schemas.ids import derived_id
from lodestream.schemas.nkey import new_user_seed, user_public_key
from lodestream.services.embedded import credentials
from lodestream.services.embedded.bindings import Binding, Holder, Plan
from lodestream.services.embedded.credentials import CredentialSync
from tests.fixtures.api import ApiHarness
from tests.fixtures.nats import RunningNats, SecureNats, connect_site, write_seed

pytestmark = pytest.mark.filterwarnings("ignore::lodestream.client.errors.WatchNotice")


@pytest.fixture
def nats_server(secure_nats: SecureNats) -> RunningNats:
    return secure_nats  # the api fixture's NATS: with the websocket listener sites use


def new_site_key(secure: SecureNats, tmp_path: Path, site: str) -> str:
    seed = new_user_seed()
    secure.seed_files[site] = write_seed(tmp_path / f"{site}.nk", seed)
    return user_public_key(seed)


def put_site_row(database_url: str, name: str, owner: str, key: str) -> None:
    """A site straight into the read model, past the API's one-key-one-principal check."""
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO rm.sites (name, id, owner, public_key, created_at, last_seq) "
            "VALUES (%s, %s, %s, %s, now(), 1)",
            (name, derived_id("site", name), owner, key),
        )


async def register(api: ApiHarness, user: str, name: str, key: str) -> None:
    response = await api.client.post(
        "/sites", json={"name": name, "public_key": key}, params={"wait": "true"},
        headers=api.user(user),
    )  # fmt: skip
    assert response.status_code == 201, response.text


async def can_connect(secure: SecureNats, site: str) -> bool:
    try:
        client = await connect_site(secure, site)
    except Exception:
        return False
    await client.close()
    return True


def new_sync(secure: SecureNats, database_url: str) -> tuple[CredentialSync, dict[str, str]]:
    """A sync, and the fixture's site keys, which nats-server no longer knows until it runs."""
    keys = dict(secure.public_keys)
    secure.set_sites({})
    return CredentialSync(secure.server, database_url, secure.user, secure.password), keys


async def test_a_duplicate_is_left_out_and_every_other_change_takes_effect(
    api: ApiHarness, secure_nats: SecureNats, database_url: str
) -> None:
    sync, keys = new_sync(secure_nats, database_url)
    alpha_key = keys["alpha"]
    await register(api, "ada", "alpha", alpha_key)
    assert sync.sync_once()
    alpha = await connect_site(secure_nats, "alpha")
    try:
        await _duplicates_left_out(api, secure_nats, database_url, sync, keys, alpha)
    finally:
        await alpha.close()


async def _duplicates_left_out(
    api: ApiHarness,
    secure_nats: SecureNats,
    database_url: str,
    sync: CredentialSync,
    keys: dict[str, str],
    alpha: Client,
) -> None:
    alpha_key = keys["alpha"]
    # The finding's state, forced past the API: bob's monitoring key and a site of mallory's
    # both hold alpha's key.
    for user in ("bob", "mallory"):
        api.user(user)  # the users exist; their bindings do not go through the API
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO public.monitoring_keys (user_name, public_key, created_at) "
            "VALUES ('bob', %s, now())",
            (alpha_key,),
        )
    put_site_row(database_url, "mallory-site", "mallory", alpha_key)
    await register(api, "ada", "beta", keys["beta"])  # a change beside it
    assert sync.sync_once()

    assert sync.refused == 0  # nothing reached nats-server that it would refuse
    assert await can_connect(secure_nats, "beta")  # the new site's credential took effect
    assert alpha.is_connected  # the key's owner (public.bound_keys) keeps it
    assert {(r["kind"], r["holder"]) for r in sync.status()["rejected"]} == {
        ("monitor", "bob"), ("site", "mallory-site")
    }  # fmt: skip
    health = (await api.client.get("/healthz")).json()["credentials"]
    assert (health["state"], health["rejected"]) == ("degraded", 2)
    bob = (await api.client.get("/users/me", headers=api.user("bob"))).json()
    assert [r["kind"] for r in bob["rejected"]] == ["monitor"]
    assert "also bound to a site" in bob["rejected"][0]["reason"]
    mine = (await api.client.get("/sites", headers=api.user("mallory"))).json()
    assert "also bound" in mine[0]["credential_error"]
    ada = (await api.client.get("/sites", headers=api.user("ada"))).json()
    assert [s["credential_error"] for s in ada] == [None, None]

    # A removed site's key is cut off, though its duplicates are still there.
    assert (await api.client.delete("/sites/alpha", headers=api.user("ada"))).status_code == 200
    await api.wait_projected(await _log_end(api))
    assert sync.sync_once()
    async with asyncio.timeout(10):
        while alpha.is_connected:
            await asyncio.sleep(0.05)
    assert not await can_connect(secure_nats, "alpha")
    assert alpha_key not in secure_nats.server.config_path.read_text()


async def test_a_binding_nats_server_refuses_is_isolated(
    api: ApiHarness,
    secure_nats: SecureNats,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second line of defence: with the dedupe switched off, nats-server itself refuses
    the duplicate; the sync finds the binding it refuses and applies everything else."""

    def no_dedupe(
        found: list[Binding], claims: dict[str, Holder], reserved: object, check: object
    ) -> Plan:
        return Plan(tuple(sorted(found)), {})

    monkeypatch.setattr(credentials, "plan", no_dedupe)
    sync, keys = new_sync(secure_nats, database_url)
    await register(api, "ada", "alpha", keys["alpha"])
    assert sync.sync_once()

    put_site_row(database_url, "mallory-site", "mallory", keys["alpha"])
    await register(api, "ada", "beta", keys["beta"])
    gamma_key = new_site_key(secure_nats, tmp_path, "gamma")
    await register(api, "bob", "gamma", gamma_key)
    assert sync.sync_once()

    assert sync.refused >= 1  # nats-server did refuse the configuration with the duplicate
    rejected = sync.status()["rejected"]
    assert [(r["kind"], r["holder"]) for r in rejected] == [("site", "mallory-site")]
    assert "nkey" in rejected[0]["reason"].lower()
    for site in ("alpha", "beta", "gamma"):  # every other change took effect
        assert await can_connect(secure_nats, site), site
    assert (await api.client.get("/healthz")).json()["credentials"]["state"] == "degraded"

    # It is not retried while it stays as it is, and a later change still applies.
    refused = sync.refused
    assert not sync.sync_once()
    assert (await api.client.delete("/sites/gamma", headers=api.user("bob"))).status_code == 200
    await api.wait_projected(await _log_end(api))
    assert sync.sync_once()
    assert sync.refused == refused
    assert not await can_connect(secure_nats, "gamma")


async def _log_end(api: ApiHarness) -> int:
    info = await api.js.stream_info("EVENTS")
    seq: int = info.state.last_seq
    return seq
