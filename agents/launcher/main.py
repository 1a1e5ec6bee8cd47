"""Wiring for ``lode launcher``: site settings and apps in, one pilot session out."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

from agents.launcher.launcher import Launcher, LauncherReport
from agents.launcher.session import LauncherSession
from agents.site.apps import load_apps
from agents.site.connect import connect_site
from agents.site.settings import load_site_settings
from lodestream.eventlog.jetstream import jetstream
from platform_adapters.compute.local import local_nodes
from platform_adapters.launchers.registry import get_launcher

log = logging.getLogger(__name__)


async def run(
    site_dir: Path, *, wall_time_min: float, stop: asyncio.Event | None = None
) -> LauncherReport:
    settings = load_site_settings(site_dir)  # errors here are the user's to fix: let them show
    apps = load_apps(settings.apps_dir)
    cfg = settings.launcher
    nodes = local_nodes(cfg.virtual_nodes, cfg.cores_per_node, cfg.gpus_per_node)
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    nc = await connect_site(settings, "launcher")
    try:
        js = jetstream(nc)
        session = LauncherSession(
            js, settings.site, heartbeat_ttl_s=cfg.heartbeat_ttl_s, wall_time_min=wall_time_min
        )
        launcher = Launcher(
            js, site=settings.site, session=session, apps=apps,
            app_launcher=get_launcher(cfg.app_launcher), nodes=nodes,
            data_dir=settings.data_dir, idle_ttl_s=cfg.idle_ttl_s, max_fetch=cfg.max_fetch,
            base_env=os.environ, nc=nc,
        )  # fmt: skip
        log.info("launcher %s: %d nodes, %d apps", session.id, len(nodes), len(apps))
        report = await launcher.run(stop)
        log.info("launcher %s exits (%s): %s", session.id, report.exit_reason, report)
        return report
    finally:
        await nc.drain()
