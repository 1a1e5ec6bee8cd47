"""``/healthz`` (the process serves requests) and ``/readyz`` (its dependencies do too)."""

from __future__ import annotations

import asyncio
from typing import Final, Literal

from fastapi import APIRouter
from nats.errors import Error as NatsError
from pydantic import BaseModel, Field
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.services.api import credsync
from lodestream.services.api.credsync import CredentialSyncOut
from lodestream.services.api.deps import ApiContext, Context
from lodestream.services.api.errors import NotReady
from lodestream.services.api.models import Check, ProjectorLag, Readiness
from lodestream.services.projector.position import applied_seq

router = APIRouter(tags=["health"])

CHECK_TIMEOUT_S: Final = 2.0


class Health(BaseModel):
    status: Literal["ok"]
    credentials: CredentialSyncOut | None = Field(
        description="the credential sync of `lode up` (null where NATS's authorization is "
        "managed elsewhere, or Postgres does not answer): a stuck or degraded sync means "
        "some credential changes are not taking effect"
    )


@router.get("/healthz", response_model=Health)
async def healthz(ctx: Context) -> Health:
    """The process serves requests (always 200); and the state of the credential sync."""
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S), ctx.engine.connect() as conn:
            credentials = await credsync.sync_state(conn)
    except (SQLAlchemyError, OSError, TimeoutError):
        credentials = None  # /readyz says why Postgres does not answer
    return Health(status="ok", credentials=credentials)


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(ctx: Context) -> Readiness:
    report = await readiness(ctx)
    if not report.ready:
        raise NotReady("not ready", report.model_dump(mode="json"))
    return report


async def readiness(ctx: ApiContext) -> Readiness:
    (nats, last_seq), (postgres, position) = await asyncio.gather(_nats(ctx), _postgres(ctx))
    lag = last_seq - position if last_seq is not None and position is not None else None
    return Readiness(
        ready=nats.ok and postgres.ok,
        nats=nats,
        postgres=postgres,
        projector=ProjectorLag(stream_last_seq=last_seq, position=position, lag=lag),
    )


async def _nats(ctx: ApiContext) -> tuple[Check, int | None]:
    if not ctx.nc.is_connected:
        return Check(ok=False, detail="not connected (reconnecting)"), None
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S):
            info = await ctx.js.stream_info(EVENTS_STREAM)
    except (NatsError, TimeoutError) as exc:
        return Check(ok=False, detail=f"stream {EVENTS_STREAM}: {exc!r}"), None
    last_seq: int = info.state.last_seq
    return Check(ok=True), last_seq


async def _postgres(ctx: ApiContext) -> tuple[Check, int | None]:
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S), ctx.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
            position = await applied_seq(conn, EVENTS_STREAM)
    except (SQLAlchemyError, OSError, TimeoutError) as exc:
        return Check(ok=False, detail=f"{type(exc).__name__}: {exc}"[:500]), None
    return Check(ok=True), position
