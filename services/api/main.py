"""Wiring for the API: ``create_app(settings)``; engines and connections live in the lifespan."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from typing import Final

from fastapi import FastAPI
from nats.aio.client import Client
from sqlalchemy.ext.asyncio import create_async_engine

from lodestream.eventlog import EventLog, JetStream, ensure_streams
from lodestream.infra.postgres.migrate import sqlalchemy_url
from lodestream.natsconn import connect
from lodestream.services.api import errors
from lodestream.services.api.deps import ApiContext
from lodestream.services.api.feedframes import FrameCache
from lodestream.services.api.feedhub import FeedHubs
from lodestream.services.api.feedslots import StreamSlots
from lodestream.services.api.routes import (
    actions,
    apps,
    batch,
    bulk,
    events,
    health,
    jobs,
    me,
    monitoring,
    results,
    sites,
    stream,
    tokens,
    transfers,
    ui,
)
from lodestream.settings import Settings

DB_POOL_SIZE: Final = 10
DB_MAX_OVERFLOW: Final = 20
GC_GEN0_THRESHOLD: Final = 50_000
# A full submission of small jobs is a few MiB; this only stops a runaway client.
MAX_BODY_BYTES: Final = 64 * 1024 * 1024


def create_app(settings: Settings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as cleanup:
            # Reads are single statements: autocommit, so no request holds a transaction open.
            engine = create_async_engine(
                sqlalchemy_url(settings.database_url),
                isolation_level="AUTOCOMMIT",
                pool_size=DB_POOL_SIZE,
                max_overflow=DB_MAX_OVERFLOW,
            )
            cleanup.push_async_callback(engine.dispose)
            nc = await connect(settings.nats_settings().model_copy(update={"name": "lode-api"}))
            cleanup.push_async_callback(_close, nc)
            # A whole submission may be in flight at once.
            js = JetStream(nc, publish_async_max_pending=2 * settings.api.max_jobs_per_request)
            await ensure_streams(
                js, settings.nats.stream_replicas, heartbeat_ttl_s=settings.nats.heartbeat_ttl_s
            )
            app.state.context = ApiContext(settings, engine, nc, js, EventLog(js))
            yield

    app = FastAPI(
        title="lodestream",
        summary="Submit and watch HPC jobs",
        lifespan=lifespan,
        max_body_size=MAX_BODY_BYTES,
    )
    errors.install(app)
    app.state.feed_hubs = FeedHubs(FrameCache())  # the push feed's, shared by its clients
    app.state.feed_slots = StreamSlots()  # the push feed's streams open per user
    routers = (
        jobs, results, bulk, actions, sites, apps, batch, transfers, events, stream, ui,
        monitoring, me, tokens, health,
    )  # fmt: skip
    for module in routers:
        app.include_router(module.router)
    return app


async def _close(nc: Client) -> None:
    # nats-py raises from close() when the connection was lost mid-reconnect; at shutdown
    # there is nothing left to flush, so that must not turn into a failed shutdown.
    with suppress(OSError):
        await nc.close()


def tune_gc() -> None:
    """Process-wide collector settings for bulk submission; call once, after imports.

    A 5,000-job submission allocates some 100,000 container objects. With the
    default gen-0 threshold (700) the collector runs over a hundred times per
    request and the occasional full pass walks every module, schema and
    route; freezing what exists at start-up takes those out of every pass.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, 20, 20)
