"""``/apps``: the applications registered at the caller's sites (by their site agents)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from lodestream.schemas.subjects import SITE_SLUG_PATTERN
from lodestream.services.api import queries
from lodestream.services.api.deps import Db, User
from lodestream.services.api.errors import (
    InvalidInput,
    NotFound,
    Unauthorized,
    Unavailable,
    documented,
)
from lodestream.services.api.models import AppOut
from lodestream.services.api.strictquery import KnownQuery

router = APIRouter(tags=["apps"])


@router.get(
    "/apps",
    dependencies=[KnownQuery],
    response_model=list[AppOut],
    responses=documented(Unauthorized, NotFound, InvalidInput, Unavailable),
)
async def list_apps(
    user: User, db: Db, site: Annotated[str | None, Query(pattern=SITE_SLUG_PATTERN)] = None
) -> list[AppOut]:
    if site is not None and site not in {
        r["name"] for r in await queries.list_sites(db, user, include_removed=False)
    }:
        raise NotFound(f"site {site!r} not found")
    return [AppOut.from_row(r) for r in await queries.list_apps(db, user, site)]
