"""``/sites``: register a site (append ``site.registered``) and list the caller's sites."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from lodestream.eventlog import ConflictError
from schemas.events.site import SiteRegistered, SiteRegisteredData
from schemas.ids import derived_id
from services.api import queries, waiting
from services.api.deps import Context, Db, User
from services.api.errors import Conflict
from services.api.models import SiteCreate, SiteCreated, SiteOut
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
        data=SiteRegisteredData(name=body.name, owner=user, description=body.description),
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
