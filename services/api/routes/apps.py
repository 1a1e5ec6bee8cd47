"""``/apps``: the applications registered at the caller's sites (by their site agents)."""

from __future__ import annotations

from fastapi import APIRouter

from services.api import queries
from services.api.deps import Db, User
from services.api.errors import NotFound
from services.api.models import AppOut

router = APIRouter(tags=["apps"])


@router.get("/apps", response_model=list[AppOut])
async def list_apps(user: User, db: Db, site: str | None = None) -> list[AppOut]:
    if site is not None and site not in {
        r["name"] for r in await queries.list_sites(db, user, include_removed=False)
    }:
        raise NotFound(f"site {site!r} not found")
    return [AppOut.from_row(r) for r in await queries.list_apps(db, user, site)]
