"""``/sites``: register a site (append ``site.registered``) and list the caller's sites."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from lodestream.eventlog import ConflictError
from schemas.envelope import Event
from schemas.events.site import (
    SiteKeyBound,
    SiteKeyData,
    SiteRegistered,
    SiteRegisteredData,
    SiteRemoved,
    SiteRemovedData,
)
from schemas.ids import derived_id
from services.api import queries, waiting
from services.api.deps import Context, Db, User
from services.api.errors import Conflict, NotFound
from services.api.models import SiteCreate, SiteCreated, SiteKey, SiteOut
from services.api.submit import actor

router = APIRouter(tags=["sites"])


@router.post("/sites", status_code=201, response_model=SiteCreated)
async def register_site(
    body: SiteCreate,
    ctx: Context,
    user: User,
    wait: bool = False,
    wait_timeout: Annotated[float | None, Query(gt=0)] = None,
) -> SiteCreated:
    """Claim a site name for the caller; names are first come, first served, forever."""
    budget = waiting.wait_budget(wait_timeout, ctx.settings.api.wait_timeout_s)
    event = SiteRegistered.create(
        site=body.name,
        aggregate_id=derived_id("site", body.name),
        actor=actor(user),
        data=SiteRegisteredData(
            name=body.name, owner=user, description=body.description, public_key=body.public_key
        ),
    )
    try:
        appended = await ctx.log.append(event, expect=0)
    except ConflictError as exc:
        async with ctx.engine.connect() as conn:
            owner = await queries.site_owner(conn, body.name)
        if owner == user:
            raise Conflict(f"site {body.name!r} is already registered to you") from exc
        raise Conflict(f"site name {body.name!r} is taken; choose another name") from exc
    created = SiteCreated(name=body.name, seq=appended.seq)
    if wait:
        await waiting.until_projected(
            ctx.engine, appended.seq, budget, created.model_dump(mode="json")
        )
    return created


@router.get("/sites", response_model=list[SiteOut])
async def list_sites(user: User, db: Db, include_removed: bool = False) -> list[SiteOut]:
    rows = await queries.list_sites(db, user, include_removed=include_removed)
    return [SiteOut.from_row(r) for r in rows]


@router.put("/sites/{name}/key", response_model=SiteCreated)
async def bind_site_key(name: str, body: SiteKey, ctx: Context, user: User) -> SiteCreated:
    """Bind or rotate the nkey a site authenticates with; the old key stops working."""
    event = SiteKeyBound.create(
        site=await _own_site(ctx, user, name), aggregate_id=derived_id("site", name),
        actor=actor(user), data=SiteKeyData(public_key=body.public_key),
    )  # fmt: skip
    return await _append(ctx, name, event)


@router.delete("/sites/{name}", response_model=SiteCreated)
async def remove_site(name: str, ctx: Context, user: User) -> SiteCreated:
    """Remove a site: its credential is revoked and its pilots are cut off."""
    event = SiteRemoved.create(
        site=await _own_site(ctx, user, name), aggregate_id=derived_id("site", name),
        actor=actor(user), data=SiteRemovedData(reason=f"removed by {user}"),
    )  # fmt: skip
    return await _append(ctx, name, event)


async def _own_site(ctx: Context, user: str, name: str) -> str:
    async with ctx.engine.connect() as conn:
        live = {row["name"] for row in await queries.list_sites(conn, user, include_removed=False)}
    if name not in live:
        raise NotFound(f"site {name!r} not found")
    return name


async def _append(ctx: Context, name: str, event: Event) -> SiteCreated:
    appended = await ctx.log.append(event, expect=None)
    return SiteCreated(name=name, seq=appended.seq)
