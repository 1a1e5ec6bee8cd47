"""The monitoring key end to end: registered through the API, rendered into nats-server by
the credential sync, read with, and revoked with the user's tokens."""

from __future__ import annotations

import asyncio

import pytest

from lodestream.client.credential import MonitorCredential
from lodestream.client.errors import CredentialRevoked
from lodestream.client.watch import Watch, watch
from lodestream.services.api.users import revoke_tokens
from lodestream.services.embedded.credentials import CredentialSync
from tests.fixtures.api import ApiHarness
from tests.fixtures.nats import RunningNats, SecureNats
from tests.support.watching import append_jobs

pytestmark = pytest.mark.filterwarnings("ignore::lodestream.client.errors.WatchNotice")


async def drain(w: Watch) -> None:
    async for _ in w:
        pass


@pytest.fixture
def nats_server(secure_nats: SecureNats) -> RunningNats:
    return secure_nats  # the api fixture's NATS: with the websocket listener watchers use


async def test_a_registered_key_reads_its_sites_until_the_user_is_revoked(
    api: ApiHarness, secure_nats: SecureNats, database_url: str
) -> None:
    await api.register_site("ada", "alpha")
    await api.register_site("bob", "beta")
    credential = MonitorCredential.new(secure_nats.server.websocket_url, secure_nats.ca_file)
    response = await api.client.put(
        "/users/me/monitoring-key", json={"public_key": credential.public_key},
        headers=api.user("ada"),
    )  # fmt: skip
    assert response.status_code == 200, response.text
    assert response.json()["sites"] == ["alpha"]
    log_end = response.json()["log_end"]
    assert log_end >= 2
    sync = CredentialSync(secure_nats.server, database_url, secure_nats.user, secure_nats.password)
    assert sync.sync_once()
    assert not sync.sync_once()  # nothing changed: no reload

    seqs = await append_jobs(api.js, "alpha", 2)
    await append_jobs(api.js, "beta", 1)
    w = watch(credential, ["alpha"], since=log_end + 1, log_end=log_end)
    got = []
    async with asyncio.timeout(30):
        async for item in w:
            got.append(item.seq)
            if len(got) == len(seqs):
                break
    assert got == seqs

    # Revoked with the user: the key leaves nats-server's config and a watcher is cut off.
    async with watch(credential, ["alpha"], since="now") as live:
        assert revoke_tokens(database_url, "ada") >= 1
        assert sync.sync_once()
        with pytest.raises(CredentialRevoked):
            await asyncio.wait_for(drain(live), 30)


async def test_bad_keys_are_refused(api: ApiHarness, secure_nats: SecureNats) -> None:
    path = "/users/me/monitoring-key"
    bad = await api.client.put(path, json={"public_key": "UNOTAKEY"}, headers=api.user("ada"))
    assert bad.status_code == 422
    key = MonitorCredential.new("wss://x", None).public_key
    assert (
        await api.client.put(path, json={"public_key": key}, headers=api.user("ada"))
    ).is_success
    taken = await api.client.put(path, json={"public_key": key}, headers=api.user("bob"))
    assert taken.status_code == 409
    assert (await api.client.get(path, headers=api.user("ada"))).json()["public_key"] == key
    assert (await api.client.delete(path, headers=api.user("ada"))).status_code == 204
    assert (await api.client.get(path, headers=api.user("ada"))).json()["public_key"] is None
    assert (await api.client.get(path)).status_code == 401
