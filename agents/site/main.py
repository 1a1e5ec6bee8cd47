"""Wiring for ``lode site start``: settings and apps in, the site agent out."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path

from lodestream.agents.site.agent import SiteAgent
from lodestream.agents.site.apps import load_apps
from lodestream.agents.site.connect import connect_site_patiently, credential_watch, disconnect
from lodestream.agents.site.forward import Forwarder
from lodestream.agents.site.retries import RetryRules
from lodestream.agents.site.settings import load_site_settings
from lodestream.eventlog.jetstream import jetstream


async def run(
    site_dir: Path,
    stop: asyncio.Event | None = None,
    on_connected: Callable[[], None] | None = None,
) -> None:
    """Run until ``stop`` (SIGINT, SIGTERM). Raises
    :class:`~lodestream.agents.site.credential.CredentialRevoked`, after stopping cleanly,
    once NATS has refused the site's credential for good. ``on_connected`` is called once the
    settings and apps are loaded and NATS has accepted the site's credential."""
    settings = load_site_settings(site_dir)  # a malformed settings.yml or app fails here, clearly
    apps = load_apps(settings.apps_dir)
    retries = RetryRules.build(settings.processing, apps)  # an app's bad retry_backoff, too
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    watch = credential_watch(settings)
    watch.on_revoked = stop.set  # unacked work goes back to the consumer; nothing is lost
    nc = await connect_site_patiently(settings, "site-agent", stop=stop, watch=watch)
    if nc is None:
        if watch.revoked:
            raise watch.error()
        return  # stopped before NATS answered
    if on_connected is not None:
        on_connected()
    try:
        hub = jetstream(nc, domain=settings.nats.hub_domain)  # None: connected to the hub
        agent = SiteAgent(hub, settings, apps, retries).run(stop)
        if settings.nats.hub_domain is None:
            await agent
        else:  # a leaf-node site: forward what its pilots kept during a cut
            forwarder = Forwarder(jetstream(nc), hub, settings.site)
            await asyncio.gather(agent, forwarder.run(stop))
    finally:
        await disconnect(nc)
    if watch.revoked:
        raise watch.error()
