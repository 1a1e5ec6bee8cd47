"""``/ui``: the live dashboard (static files), its login, and its reads.

The page loads one snapshot (``/ui/api/summary``) and then follows ``/events/stream``
from the snapshot's position; it never polls. Job search and a job's history are reads
the user asks for. The reads here take the dashboard's cookie as well as a bearer token
(:mod:`lodestream.services.api.uisession`); nothing here changes anything but the cookie.
"""

from __future__ import annotations

import uuid
from importlib import resources
from typing import Annotated, Any, Final

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, Field
from sqlalchemy.ext.asyncio import AsyncConnection

from lodestream.schemas.ids import MIN_ID_PART, id_part
from lodestream.schemas.resources import APP_NAME_PATTERN
from lodestream.schemas.states import JobState
from lodestream.schemas.subjects import SITE_SLUG_PATTERN
from lodestream.services.api import dashboard, queries
from lodestream.services.api.deps import Context, token_hash
from lodestream.services.api.errors import (
    InvalidInput,
    NotFound,
    TooLarge,
    Unauthorized,
    Unavailable,
    documented,
)
from lodestream.services.api.models import JobEventOut, JobOut
from lodestream.services.api.routes.jobs import TAG_HELP, TagFilter, parse_tags
from lodestream.services.api.strictquery import KnownQuery
from lodestream.services.api.uisession import COOKIE, Viewer, session_value

router = APIRouter(tags=["dashboard"])

STATIC: Final = {
    "fold.js": "text/javascript; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
# Only our own files run on the page, and it cannot be framed (clickjacking).
PAGE_HEADERS: Final = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
SEARCH_LIMIT: Final = 100
ID_HELP: Final = f"a job id, or {MIN_ID_PART}+ hex digits it begins or ends with"
_READS = documented(Unauthorized, InvalidInput, Unavailable)


def _asset(name: str) -> bytes:
    return resources.files("lodestream.services.api").joinpath("ui", name).read_bytes()


@router.get("/ui", response_class=HTMLResponse, include_in_schema=False)
async def page() -> Response:
    return Response(_asset("index.html"), media_type="text/html; charset=utf-8",
                    headers=PAGE_HEADERS)  # fmt: skip


@router.get("/ui/static/{name}", include_in_schema=False)
async def static(name: str) -> Response:
    if name not in STATIC:
        raise NotFound(f"no dashboard file {name!r}")
    return Response(_asset(name), media_type=STATIC[name], headers=PAGE_HEADERS)


class Login(BaseModel):
    token: str = Field(min_length=1, max_length=200)


@router.post(
    "/ui/session",
    status_code=204,
    responses=documented(Unauthorized, InvalidInput, TooLarge, Unavailable),
)
async def log_in(body: Login, request: Request, ctx: Context) -> Response:
    """Trade an API token for the dashboard's read-only session cookie (HttpOnly)."""
    digest = token_hash(body.token)
    async with ctx.engine.connect() as conn:
        if await queries.user_for_token(conn, digest) is None:
            raise Unauthorized("invalid or revoked token")
    response = Response(status_code=204)
    response.set_cookie(
        COOKIE,
        session_value(ctx, digest),
        max_age=int(ctx.settings.api.stream.session_hours * 3600),
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.delete("/ui/session", status_code=204)
async def log_out() -> Response:
    response = Response(status_code=204)
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return response


@router.get("/ui/api/summary", responses=_READS, dependencies=[KnownQuery])
async def summary(
    user: Viewer,
    ctx: Context,
    app: Annotated[str | None, Query(pattern=APP_NAME_PATTERN)] = None,
    tag: Annotated[list[TagFilter] | None, Query(description=TAG_HELP)] = None,
) -> dict[str, Any]:
    """The caller's jobs (of ``app``, with every ``tag``, when given), sessions and recent
    failures at one projector position."""
    tags = parse_tags(tag or [])
    return {"user": user, **await dashboard.snapshot(ctx.engine, user, app, tags)}


@router.get(
    "/ui/api/jobs", response_model=list[JobOut], responses=_READS, dependencies=[KnownQuery]
)
async def search_jobs(
    *,
    user: Viewer,
    ctx: Context,
    job_id: Annotated[str | None, Query(max_length=36, description=ID_HELP)] = None,
    site: Annotated[str | None, Query(pattern=SITE_SLUG_PATTERN)] = None,
    app: Annotated[str | None, Query(pattern=APP_NAME_PATTERN)] = None,
    state: JobState | None = None,
    tag: Annotated[str | None, Query(description="key:value")] = None,
    limit: Annotated[int, Query(ge=1, le=SEARCH_LIMIT)] = 50,
) -> list[JobOut]:
    """The caller's newest jobs matching every criterion given (by ``job_id``: the job with
    that id, or those whose id begins or ends with its hex digits)."""
    async with ctx.engine.connect() as conn:
        if job_id is not None:
            return await _by_id(conn, user, job_id, limit)
        filters = queries.JobFilter(
            site=site,
            app=app,
            states=(state.value,) if state else (),
            tags=parse_tags([tag] if tag else []),
        )
        rows = await queries.list_jobs(
            conn, user, filters, order_by="-created", limit=limit, offset=0
        )
    return [JobOut.from_row(r) for r in rows]


async def _by_id(conn: AsyncConnection, user: str, text: str, limit: int) -> list[JobOut]:
    try:
        row = await queries.get_job(conn, user, uuid.UUID(text))
    except ValueError:
        pass
    else:
        return [JobOut.from_row(row)] if row is not None else []
    digits = id_part(text)
    if digits is None:
        raise InvalidInput(f"job_id: a job id or {MIN_ID_PART}+ hex digits of one, not {text!r}")
    found: dict[uuid.UUID, JobOut] = {}
    for part in (queries.JobFilter(id_prefix=digits), queries.JobFilter(id_suffix=digits)):
        rows = await queries.list_jobs(conn, user, part, order_by="-created", limit=limit, offset=0)
        found.update((r["id"], JobOut.from_row(r)) for r in rows)
    return list(found.values())[:limit]


@router.get(
    "/ui/api/jobs/{job_id}/events",
    response_model=list[JobEventOut],
    responses=documented(Unauthorized, NotFound, InvalidInput, Unavailable),
)
async def job_history(job_id: uuid.UUID, user: Viewer, ctx: Context) -> list[JobEventOut]:
    async with ctx.engine.connect() as conn:
        if await queries.get_job(conn, user, job_id) is None:
            raise NotFound(f"job {job_id} not found")
        return [JobEventOut.from_row(r) for r in await queries.events_of_job(conn, job_id)]
