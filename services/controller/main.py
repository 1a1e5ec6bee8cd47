"""Wiring for ``lode controller``: settings in, the controller's consumers out."""

from __future__ import annotations

import asyncio
import logging
import signal

from lodestream.eventlog import ensure_streams
from lodestream.eventlog.jetstream import jetstream
from lodestream.natsconn import connect
from lodestream.services.controller.loop import Controller
from lodestream.settings import Settings

log = logging.getLogger(__name__)
DRAIN_TIMEOUT_S = 5.0


async def run(settings: Settings, stop: asyncio.Event | None = None) -> None:
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    nc = await connect(settings.nats_settings().model_copy(update={"name": "lode-controller"}))
    try:
        js = jetstream(nc)
        await ensure_streams(
            js, settings.nats.stream_replicas, heartbeat_ttl_s=settings.nats.heartbeat_ttl_s
        )
        await Controller(
            js, settings.database_url, scaler_period_s=settings.controller.scaler_period_s
        ).run(stop)
    finally:
        # A drain that cannot finish (NATS away) must not hide why we are stopping.
        try:
            await asyncio.wait_for(nc.drain(), DRAIN_TIMEOUT_S)
        except Exception as exc:  # shutting down either way
            log.warning("controller: drain failed (%s); closing", exc)
            await nc.close()
