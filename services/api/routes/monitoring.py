"""``/users/me/monitoring-key``: the nkey the caller watches its sites' events live with.

The seed is made on the user's machine; the API stores only the public key (an auth table
of its own, ``public.monitoring_keys``), and the control plane's credential sync renders
it into nats-server's authorization with the read-only permissions of
:mod:`lodestream.infra.nats.monitor`. Registering a key replaces the previous one;
``DELETE`` and revoking the user's tokens remove it. The key is bound to this credential
alone (:mod:`lodestream.services.api.keys`): one that is a site's, another user's or the
control plane's is refused with 409.
"""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, Response
from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import IntegrityError

from lodestream.infra.postgres.tables import monitoring_keys
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.services.api import credsync, keys, queries
from lodestream.services.api.deps import Context, User
from lodestream.services.api.errors import (
    Conflict,
    InvalidInput,
    TooLarge,
    Unauthorized,
    Unavailable,
    documented,
)
from lodestream.services.api.models import MonitoringKeyIn, MonitoringKeyOut

router = APIRouter(tags=["monitoring"])
PATH = "/users/me/monitoring-key"


@router.get(PATH, response_model=MonitoringKeyOut, responses=documented(Unauthorized, Unavailable))
async def get_monitoring_key(ctx: Context, user: User) -> MonitoringKeyOut:
    """The caller's monitoring key (``null`` if none), its sites and the end of the log."""
    async with ctx.engine.connect() as conn:
        key = (
            await conn.execute(
                select(monitoring_keys.c.public_key).where(monitoring_keys.c.user_name == user)
            )
        ).scalar_one_or_none()
    return await _out(ctx, user, key)


@router.put(
    PATH,
    response_model=MonitoringKeyOut,
    responses=documented(Unauthorized, Conflict, TooLarge, InvalidInput, Unavailable),
)
async def put_monitoring_key(body: MonitoringKeyIn, ctx: Context, user: User) -> MonitoringKeyOut:
    """Register the caller's monitoring key; the previous one stops working.

    409 if the key is bound to anything else (a site, another user's key, the control plane).
    """
    statement = insert(monitoring_keys).values(
        user_name=user, public_key=body.public_key, created_at=datetime.now(UTC)
    )
    statement = statement.on_conflict_do_update(
        index_elements=[monitoring_keys.c.user_name],
        set_={"public_key": statement.excluded.public_key,
              "created_at": statement.excluded.created_at},
    )  # fmt: skip
    try:
        async with ctx.engine.begin() as conn:
            # One transaction: the key is bound to this user's credential, or nothing changes.
            await keys.bind(conn, ctx.settings, body.public_key, "monitor", holder=user, owner=user)
            await conn.execute(statement)
            await keys.release(conn, "monitor", user, keep=body.public_key)
    except IntegrityError as exc:
        raise Conflict("this public key is already registered; make a new key") from exc
    return await _out(ctx, user, body.public_key)


@router.delete(
    PATH, status_code=204, response_class=Response, responses=documented(Unauthorized, Unavailable)
)
async def delete_monitoring_key(ctx: Context, user: User) -> Response:
    """Revoke the caller's monitoring key; its watchers are disconnected."""
    async with ctx.engine.begin() as conn:
        await conn.execute(delete(monitoring_keys).where(monitoring_keys.c.user_name == user))
        await keys.release(conn, "monitor", user)
    return Response(status_code=204)


async def _out(ctx: Context, user: str, key: str | None) -> MonitoringKeyOut:
    async with ctx.engine.connect() as conn:
        rows = await queries.list_sites(conn, user, include_removed=False)
        failed = await credsync.rejects_of(conn, "monitor", {user: key})
    info = await ctx.js.stream_info(EVENTS_STREAM)
    return MonitoringKeyOut(
        public_key=key,
        sites=[str(r["name"]) for r in rows],
        log_end=info.state.last_seq,
        credential_error=failed.get(user),
    )
