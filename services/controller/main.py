"""Wiring for ``lode controller``: settings in, the controller's consumers out."""

from __future__ import annotations

import asyncio
import signal

from lodestream.eventlog import ensure_streams
from lodestream.eventlog.jetstream import jetstream
from lodestream.natsconn import connect
from lodestream.settings import Settings
from services.controller.loop import Controller


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
        await Controller(js, settings.database_url).run(stop)
    finally:
        await nc.drain()
