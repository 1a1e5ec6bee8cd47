"""How a site process (agent or launcher) reaches NATS: outbound wss, its nkey, its inbox."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable
from typing import Any

import nats.errors
from nats.aio.client import Client

from lodestream import natsprivate
from lodestream.agents.site.credential import CredentialWatch
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
    watch: CredentialWatch,
    deadline: float = math.inf,
    reconnected_cb: Callable[[], Awaitable[None]] | None = None,
    **options: Any,
) -> Client | None:
    """:func:`connect_site`, retried with capped backoff while NATS cannot be reached.

    Returns None if ``stop`` is set or ``deadline`` (``time.monotonic()``) passes first.
    Once connected, the client reconnects forever, like every lodestream process, and
    ``watch`` hears every error and every reconnect, to tell when the site's credential
    was revoked; raises :class:`~lodestream.agents.site.credential.CredentialRevoked` if
    that happens before the first connect.
    """

    async def reconnected() -> None:
        watch.connected()
        if reconnected_cb is not None:
            await reconnected_cb()

    async def attempt() -> Client:
        # nats-py retries a first connect forever when reconnects are endless, deaf to
        # ``stop`` and to the deadline: bound this attempt, then make reconnects endless.
        try:
            client = await connect_site(
                settings, name, **options, on_error=watch.observe,
                reconnected_cb=reconnected, max_reconnect_attempts=1,
            )  # fmt: skip
        except Exception as exc:
            if watch.revoked:
                raise watch.error() from exc
            raise
        watch.connected()
        client.options["max_reconnect_attempts"] = -1
        return client

    return await retry_until(
        f"{name}: connect to {settings.nats.url}",
        attempt,
        retryable=lambda exc: isinstance(exc, OSError | TimeoutError | nats.errors.Error),
        stop=stop,
        deadline=deadline,
    )


def credential_watch(settings: SiteSettings) -> CredentialWatch:
    return CredentialWatch(settings.site, after_s=settings.nats.revoked_after_s)


async def disconnect(nc: Client) -> None:
    """Flush what is pending and close; if NATS is away (a drain is refused then), just close."""
    try:
        await nc.drain()
    except (nats.errors.Error, TimeoutError, OSError):
        try:
            await nc.close()
        except OSError:
            # Refused by the server (a revoked key): nats-py writes what it buffered while
            # reconnecting into a websocket that is already closing, and raises before it
            # closes its transport. Finish for it, or the aiohttp session stays open.
            transport = natsprivate.transport_of(nc)
            if transport is not None:
                transport.close()
                with contextlib.suppress(Exception):
                    await transport.wait_closed()
