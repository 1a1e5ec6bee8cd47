"""Site credentials follow the log: registered keys connect, removed ones are cut off."""

from __future__ import annotations

import asyncio

import pytest

from lodestream.embedded.credentials import CredentialSync
from lodestream.eventlog import EventLog
from schemas.events import SiteRemoved
from schemas.events.site import SiteRegistered, SiteRegisteredData
from schemas.ids import derived_id
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
