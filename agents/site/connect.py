"""How a site process (agent or launcher) reaches NATS: outbound wss, its nkey, its inbox."""

from __future__ import annotations

from nats.aio.client import Client

from agents.site.settings import SiteSettings
from infra.nats.auth import site_inbox_prefix
from lodestream.natsconn import connect
from lodestream.settings import NatsSettings


async def connect_site(settings: SiteSettings, name: str) -> Client:
    """Connect as the site: only its own subjects and consumers are reachable."""
    nats = NatsSettings(
        url=settings.nats.url,
        ca_file=settings.ca_path,
        nkey_seed_file=settings.seed_path,
        inbox_prefix=site_inbox_prefix(settings.site),
        name=f"{name}-{settings.site}",
    )
    return await connect(nats)
