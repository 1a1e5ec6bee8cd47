"""``/events``: the polling feed of the caller's job events, in log order."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.services.api import queries
from lodestream.services.api.deps import Context, Db, User
from lodestream.services.api.errors import InvalidInput, Unauthorized, Unavailable, documented
from lodestream.services.api.models import MAX_PAGE_SIZE, SEQ_MAX, EventPage, JobEventOut
from lodestream.services.api.strictquery import KnownQuery
from lodestream.services.projector.position import applied_seq

router = APIRouter(tags=["events"])


@router.get(
    "/events",
    dependencies=[KnownQuery],
    response_model=EventPage,
    responses=documented(Unauthorized, InvalidInput, Unavailable),
)
async def events_after(
    user: User,
    db: Db,
    ctx: Context,
    after_seq: Annotated[int, Query(ge=0, le=SEQ_MAX)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = 100,
) -> EventPage:
    """Job events with ``seq > after_seq``; continue from ``next_after_seq``."""
    if limit > ctx.settings.api.max_page_size:
        raise InvalidInput(f"limit must be at most {ctx.settings.api.max_page_size}, got {limit}")
    # The projector commits rows and position together: everything up to the position read
    # first is visible to the next statement, so a short page may skip ahead to it.
    position = await applied_seq(db, EVENTS_STREAM)
    rows = await queries.events_after(db, user, after_seq, position, limit)
    items = [JobEventOut.from_row(r) for r in rows]
    full = len(items) == limit
    next_after = items[-1].seq if full else max(after_seq, position)
    return EventPage(items=items, next_after_seq=next_after)
