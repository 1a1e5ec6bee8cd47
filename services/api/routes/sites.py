"""``/sites``: register a site (append ``site.registered``) and list the caller's sites."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from lodestream.eventlog import ConflictError
from lodestream.schemas.envelope import Event
from lodestream.schemas.events.site import (
    SiteKeyBound,
    SiteKeyData,
    SiteRegistered,
    SiteRegisteredData,
    SiteRemoved,
    SiteRemovedData,
)
from lodestream.schemas.ids import derived_id
from lodestream.schemas.subjects import SITE_SLUG_PATTERN
from lodestream.services.api import appends, credsync, keys, queries, waiting
from lodestream.services.api.deps import Context, Db, User
from lodestream.services.api.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    NotYetProjected,
    TooLarge,
    Unauthorized,
    Unavailable,
    documented,
)
from lodestream.services.api.models import (
    ScalerDecisionOut,
    ScalerOut,
    SiteCreate,
    SiteCreated,
    SiteKey,
    SiteOut,
)
from lodestream.services.api.strictquery import KnownQuery
from lodestream.services.api.submit import actor

router = APIRouter(tags=["sites"])

OwnSite = Annotated[str, Path(pattern=SITE_SLUG_PATTERN, description="one of the caller's sites")]


@router.post(
    "/sites",
    status_code=201,
    response_model=SiteCreated,
    responses=documented(
        Unauthorized, Conflict, TooLarge, InvalidInput, Unavailable, NotYetProjected
    ),
)
async def register_site(
    body: SiteCreate,
    ctx: Context,
    user: User,
    wait: bool = False,
    wait_timeout: Annotated[float | None, Query(gt=0, allow_inf_nan=False)] = None,
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
    appends.ensure_fits(event, 0, ctx.nc.max_payload)
    fresh = await _bind(ctx, user, body.name, body.public_key)
    try:
        appended = await ctx.log.append(event, expect=0)
    except ConflictError as exc:
        await _unbind(ctx, body.name, body.public_key if fresh else None)
        async with ctx.engine.connect() as conn:
            owner = await queries.site_owner(conn, body.name)
        if owner == user:
            raise Conflict(f"site {body.name!r} is already registered to you") from exc
        raise Conflict(f"site name {body.name!r} is taken; choose another name") from exc
    except Exception:
        await _unbind(ctx, body.name, body.public_key if fresh else None)
        raise
    created = SiteCreated(name=body.name, seq=appended.seq)
    if wait:
        await waiting.until_projected(
            ctx.engine, appended.seq, budget, created.model_dump(mode="json")
        )
    return created


@router.get(
    "/sites",
    dependencies=[KnownQuery],
    response_model=list[SiteOut],
    responses=documented(Unauthorized, InvalidInput, Unavailable),
)
async def list_sites(user: User, db: Db, include_removed: bool = False) -> list[SiteOut]:
    rows = await queries.list_sites(db, user, include_removed=include_removed)
    bound = {str(r["name"]): r["public_key"] for r in rows if r["removed_at"] is None}
    failed = await credsync.rejects_of(db, "site", bound)
    return [SiteOut.from_row(r, failed.get(str(r["name"]))) for r in rows]


@router.get(
    "/sites/{name}/scaler",
    response_model=ScalerOut,
    responses=documented(Unauthorized, NotFound, InvalidInput, Unavailable),
)
async def site_scaler(
    name: OwnSite,
    user: User,
    db: Db,
    limit: Annotated[int, Query(ge=1, le=1000, description="decisions, newest first")] = 20,
) -> ScalerOut:
    """The site's elastic queue: the backlog the control plane last told it, and its latest
    decisions, each with the inputs it was made from."""
    if name not in {r["name"] for r in await queries.list_sites(db, user, include_removed=False)}:
        raise NotFound(f"site {name!r} not found")
    row = await queries.scaler(db, name)
    decisions = await queries.scaler_decisions_of(db, name, limit)
    return ScalerOut(
        site=name,
        backlog=row["backlog"] if row is not None else None,
        backlog_at=row["backlog_at"] if row is not None else None,
        decisions=[ScalerDecisionOut.from_row(d) for d in decisions],
    )


_SITE_CHANGE_ERRORS = documented(
    Unauthorized, NotFound, Conflict, TooLarge, InvalidInput, Unavailable
)


@router.put("/sites/{name}/key", response_model=SiteCreated, responses=_SITE_CHANGE_ERRORS)
async def bind_site_key(name: OwnSite, body: SiteKey, ctx: Context, user: User) -> SiteCreated:
    """Bind or rotate the nkey a site authenticates with; the old key stops working."""
    last_seq = await _own_site_seq(ctx, user, name)
    event = SiteKeyBound.create(
        site=name, aggregate_id=derived_id("site", name),
        actor=actor(user), data=SiteKeyData(public_key=body.public_key),
    )  # fmt: skip
    fresh = await _bind(ctx, user, name, body.public_key)
    try:
        created = await _append(ctx, name, event, last_seq)
    except Exception:
        await _unbind(ctx, name, body.public_key if fresh else None)
        raise
    async with ctx.engine.begin() as conn:
        await keys.release(conn, "site", name, keep=body.public_key)  # the old key is free
    return created


@router.delete("/sites/{name}", response_model=SiteCreated, responses=_SITE_CHANGE_ERRORS)
async def remove_site(name: OwnSite, ctx: Context, user: User) -> SiteCreated:
    """Remove a site: its credential is revoked and its pilots are cut off."""
    last_seq = await _own_site_seq(ctx, user, name)
    event = SiteRemoved.create(
        site=name, aggregate_id=derived_id("site", name),
        actor=actor(user), data=SiteRemovedData(reason=f"removed by {user}"),
    )  # fmt: skip
    removed = await _append(ctx, name, event, last_seq)
    async with ctx.engine.begin() as conn:
        await keys.release(conn, "site", name)
    return removed


async def _bind(ctx: Context, user: str, name: str, key: str | None) -> bool:
    """Bind ``key`` to site ``name`` before its event is appended (409 if it is taken).

    True if this call bound it: that binding is undone if the append fails.
    """
    if key is None:
        return False
    async with ctx.engine.begin() as conn:
        return await keys.bind(conn, ctx.settings, key, "site", holder=name, owner=user)


async def _unbind(ctx: Context, name: str, key: str | None) -> None:
    if key is not None:
        async with ctx.engine.begin() as conn:
            await keys.release_key(conn, key, "site", name)


async def _own_site_seq(ctx: Context, user: str, name: str) -> int:
    """The stream sequence of the last event of ``name``, one of the caller's live sites."""
    async with ctx.engine.connect() as conn:
        rows = await queries.list_sites(conn, user, include_removed=False)
    for row in rows:
        if row["name"] == name:
            return int(row["last_seq"])
    raise NotFound(f"site {name!r} not found")


async def _append(ctx: Context, name: str, event: Event, expect: int) -> SiteCreated:
    appends.ensure_fits(event, expect, ctx.nc.max_payload)
    try:
        appended = await ctx.log.append(event, expect=expect)
    except ConflictError as exc:
        # The site changed after the read model we judged by (a removal not yet projected,
        # say): appending anyway could change a site that is already gone.
        raise Conflict(
            f"site {name!r} changed meanwhile (the change may not be visible yet); retry"
        ) from exc
    return SiteCreated(name=name, seq=appended.seq)
