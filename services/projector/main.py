"""Wiring for ``lode projector run``: settings in, two fold loops (EVENTS and HB) out."""

from __future__ import annotations

import asyncio
import logging
import signal

from lodestream.eventlog import ensure_streams
from lodestream.eventlog.jetstream import jetstream
from lodestream.infra.postgres.tables import READ_SCHEMA
from lodestream.natsconn import connect
from lodestream.schemas.subjects import EVENTS_STREAM, HB_STREAM
from lodestream.services.projector.consumer import Projector
from lodestream.services.projector.rebuild import Rebuild, RebuildReport
from lodestream.services.projector.store import ProjectionStore
from lodestream.settings import Settings

log = logging.getLogger(__name__)


async def run(settings: Settings, stop: asyncio.Event | None = None) -> None:
    stop = stop or _stop_on_signals()
    nc = await connect(settings.nats_settings().model_copy(update={"name": "lode-projector"}))
    js = jetstream(nc)
    await ensure_streams(
        js, settings.nats.stream_replicas, heartbeat_ttl_s=settings.nats.heartbeat_ttl_s
    )
    store = ProjectionStore(READ_SCHEMA)
    cfg = settings.projector
    projectors = [
        Projector(js, settings.database_url, stream=stream, durable=durable, store=store,
                  batch_size=cfg.batch_size, fetch_timeout_s=cfg.fetch_timeout_s,
                  contiguous=contiguous, linger_s=linger)
        # Heartbeats come a few a second and their expiry markers should show at once.
        for stream, durable, contiguous, linger in (
            (EVENTS_STREAM, cfg.durable, True, cfg.linger_s),
            (HB_STREAM, f"{cfg.durable}-hb", False, 0.0),
        )
    ]  # fmt: skip
    log.info("projector running (batch %d)", cfg.batch_size)
    try:
        await asyncio.gather(*(p.run(stop) for p in projectors))
    finally:
        await nc.drain()


async def rebuild(settings: Settings, *, workers: int | None = None) -> RebuildReport:
    nc = await connect(settings.nats_settings().model_copy(update={"name": "lode-rebuild"}))
    try:
        return await Rebuild(jetstream(nc), settings.database_url, workers=workers).run()
    finally:
        await nc.close()


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop
