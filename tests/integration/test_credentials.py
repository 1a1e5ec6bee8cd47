"""Site credentials follow the log: registered keys connect, removed ones are cut off."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from lodestream.eventlog import EventLog
from lodestream.schemas.events import SiteRemoved
from lodestream.schemas.events.site import SiteRegistered, SiteRegisteredData
from lodestream.schemas.ids import derived_id
from lodestream.services.embedded.credentials import CredentialSync
from tests.fixtures.nats import ErrorLog, SecureNats, connect_site
from tests.integration.test_launcher import control_plane
from tests.support.projection import wait_for_position


async def test_registering_and_removing_a_site_changes_who_may_connect(
    secure_nats: SecureNats, database_url: str
) -> None:
    sync = CredentialSync(secure_nats.server, database_url, secure_nats.user, secure_nats.password)
    async with control_plane(secure_nats, database_url) as js:
        log = EventLog(js)
        registered = SiteRegistered.create(
            site="alpha", aggregate_id=derived_id("site", "alpha"), actor="user:ada",
            data=SiteRegisteredData(name="alpha", owner="ada",
                                    public_key=secure_nats.public_keys["alpha"]),
        )  # fmt: skip
        await wait_for_position(database_url, (await log.append(registered, expect=0)).seq)
        assert sync.sync_once()
        assert not sync.sync_once()  # nothing changed: no reload

        alpha_errors = ErrorLog()
        alpha = await connect_site(secure_nats, "alpha", alpha_errors)
        with pytest.raises(Exception, match=r"(?i)authorization"):
            await connect_site(secure_nats, "beta")  # never registered through the log

        removed = SiteRemoved.create(
            site="alpha", aggregate_id=derived_id("site", "alpha"), actor="user:ada"
        )
        await wait_for_position(database_url, (await log.append(removed, expect=None)).seq)
        assert sync.sync_once()
        async with asyncio.timeout(10):
            while alpha.is_connected:
                await asyncio.sleep(0.05)
        await alpha.close()
        with pytest.raises(Exception, match=r"(?i)authorization"):
            await connect_site(secure_nats, "alpha")


def _put_site(database_url: str, name: str, public_key: str) -> None:
    """A site row straight into the read model, where CredentialSync reads keys from."""
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO rm.sites (name, id, owner, public_key, created_at, last_seq) "
            "VALUES (%s, %s, 'ada', %s, now(), 1) "
            "ON CONFLICT (name) DO UPDATE SET public_key = EXCLUDED.public_key",
            (name, derived_id("site", name), public_key),
        )


async def test_a_bad_key_is_left_out_and_every_other_site_still_gets_in(
    secure_nats: SecureNats, database_url: str
) -> None:
    keys = dict(secure_nats.public_keys)
    secure_nats.set_sites({})  # nobody registered yet
    sync = CredentialSync(secure_nats.server, database_url, secure_nats.user, secure_nats.password)
    good_key = keys["alpha"]
    bad_key = good_key[:-1] + ("A" if good_key[-1] != "A" else "B")  # checksum no longer holds
    _put_site(database_url, "alpha", good_key)
    _put_site(database_url, "beta", bad_key)

    assert sync.sync_once()

    assert sync.refused == 0
    assert set(sync.invalid) == {"beta"}
    assert "checksum" in sync.invalid["beta"]
    config = secure_nats.server.config_path.read_text()
    assert good_key in config
    assert bad_key not in config
    alpha = await connect_site(secure_nats, "alpha")
    await alpha.close()

    # The site fixes its key: it is applied, and reported no more.
    _put_site(database_url, "beta", keys["beta"])
    assert sync.sync_once()
    assert sync.invalid == {}
    beta = await connect_site(secure_nats, "beta")
    await beta.close()


async def test_keys_are_applied_again_after_nats_server_restarts(
    secure_nats: SecureNats, database_url: str
) -> None:
    server = secure_nats.server
    keys = dict(secure_nats.public_keys)
    secure_nats.set_sites({})
    sync = CredentialSync(server, database_url, secure_nats.user, secure_nats.password)
    assert not sync.sync_once()  # no sites: the server already runs on that

    server.kill()
    _put_site(database_url, "alpha", keys["alpha"])
    assert not sync.sync_once()  # down: nothing to reload, and no error either
    server.restart()
    sync.invalidate()  # what the supervisor does after restarting nats-server
    assert sync.sync_once()

    alpha = await connect_site(secure_nats, "alpha")
    await alpha.close()
    assert sync.status()["reloads"] == 1
