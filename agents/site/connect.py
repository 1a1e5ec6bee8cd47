"""How a site process (agent or launcher) reaches NATS: outbound wss, its nkey, its inbox."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import nats.errors
from nats.aio.client import Client

from lodestream.agents.site.retry import retry_until
from lodestream.agents.site.settings import SiteSettings
from lodestream.infra.nats.auth import site_inbox_prefix
from lodestream.natsconn import connect
from lodestream.settings import NatsSettings


def site_nats_settings(settings: SiteSettings, name: str) -> NatsSettings:
    return NatsSettings(
        url=settings.nats.url,
        ca_file=settings.ca_path,
        nkey_seed_file=settings.seed_path,
        inbox_prefix=site_inbox_prefix(settings.site),
        name=f"{name}-{settings.site}",
    )


async def connect_site(settings: SiteSettings, name: str, **options: Any) -> Client:
    """Connect as the site: only its own subjects and consumers are reachable."""
    return await connect(site_nats_settings(settings, name), **options)


async def connect_site_patiently(
    settings: SiteSettings,
    name: str,
    *,
    stop: asyncio.Event,
    deadline: float = math.inf,
    **options: Any,
) -> Client | None:
    """:func:`connect_site`, retried with capped backoff while NATS cannot be reached.

    Returns None if ``stop`` is set or ``deadline`` (``time.monotonic()``) passes first.
    Once connected, the client reconnects forever, like every lodestream process.
    """

    async def attempt() -> Client:
        # nats-py retries a first connect forever when reconnects are endless, deaf to
        # ``stop`` and to the deadline: bound this attempt, then make reconnects endless.
        client = await connect_site(settings, name, **options, max_reconnect_attempts=1)
        client.options["max_reconnect_attempts"] = -1
        return client

    return await retry_until(
        f"{name}: connect to {settings.nats.url}",
        attempt,
        retryable=lambda exc: isinstance(exc, OSError | TimeoutError | nats.errors.Error),
        stop=stop,
        deadline=deadline,
    )


async def disconnect(nc: Client) -> None:
    """Flush what is pending and close; if NATS is away (a drain is refused then), just close."""
    try:
        await nc.drain()
    except (nats.errors.Error, TimeoutError):
        await nc.close()
