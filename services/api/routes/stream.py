"""``/events/stream``: the push feed of the caller's sites' events, as server-sent events.

For browsers and for clients that cannot reach NATS. Each event is one SSE message whose
``id`` is its stream sequence and whose ``data`` is the event's JSON with ``seq`` added; a
client resumes after a sequence with the ``Last-Event-ID`` header (what EventSource sends
when it reconnects) or ``?since=``. Without either the feed starts at the end of the log.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Annotated

import anyio
from fastapi import APIRouter, Header, Request
from fastapi.responses import StreamingResponse

from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.services.api import queries
from lodestream.services.api.deps import Context
from lodestream.services.api.errors import (
    InvalidInput,
    NotFound,
    TooMany,
    Unauthorized,
    Unavailable,
    documented,
)
from lodestream.services.api.feed import LiveFeed
from lodestream.services.api.feedfilter import FILTER_NAMES, parse_filter
from lodestream.services.api.feedresponse import SSE_HEADERS, FeedResponse
from lodestream.services.api.models import SEQ_MAX
from lodestream.services.api.uisession import Viewer

router = APIRouter(tags=["events"])

_DESCRIPTION = f"""Server-sent events (``text/event-stream``) of the caller's sites.

Filters (each may repeat; an unknown name is refused with 422): {", ".join(FILTER_NAMES)}.
Resume with the ``Last-Event-ID`` header or ``since`` (a stream sequence; the header wins).
A client that cannot keep up (``queue_size`` events or ``queue_bytes`` bytes waiting for
it for ``lag_s``, or a socket that takes nothing for ``lag_s``) receives ``event: lagged``
with ``last_seq`` and is disconnected; it resumes from there. Comments (``: keepalive``)
keep idle streams open. One user may hold ``max_streams_per_user`` streams at once on one
api; past that the answer is 429 until one ends.
Authenticated by bearer token, or by the dashboard's session cookie (``/ui``).
"""


@router.get(
    "/events/stream",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "the event stream"},
        **documented(Unauthorized, NotFound, InvalidInput, TooMany, Unavailable),
    },
    description=_DESCRIPTION,
)
async def event_stream(
    request: Request,
    user: Viewer,
    ctx: Context,
    last_event_id: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> StreamingResponse:
    query = {name: request.query_params.getlist(name) for name in request.query_params}
    async with ctx.engine.connect() as conn:
        own = [r["name"] for r in await queries.list_sites(conn, user, include_removed=False)]
    chosen = parse_filter(query, own)
    after, log_end = await _resume_point(ctx, last_event_id, query.get("since", []))
    settings = ctx.settings.api.stream
    free_slot = request.app.state.feed_slots.take(user, settings.max_streams_per_user)
    try:
        if not chosen.sites:
            idle = _nothing(settings.heartbeat_s, free_slot)
            return StreamingResponse(idle, media_type="text/event-stream", headers=SSE_HEADERS)
        feed = LiveFeed(ctx.js, chosen, after, settings, request.app.state.feed_hubs)
        try:
            await feed.open(log_end)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await feed.close()
            raise
    except BaseException:
        free_slot()
        raise
    return FeedResponse(feed, settings, free_slot)


async def _resume_point(ctx: Context, header: str | None, since: list[str]) -> tuple[int, int]:
    """The sequence to resume after (the end of the log when the client names none), and
    the end of the log."""
    last = int((await ctx.js.stream_info(EVENTS_STREAM)).state.last_seq)
    if header is not None and header.strip():
        raw, where = header.strip(), "Last-Event-ID"
    elif since:
        raw, where = since[-1], "since"
    else:
        return last, last
    if not raw.isdigit() or int(raw) > SEQ_MAX:
        raise InvalidInput(f"{where} must be a stream sequence (a whole number), got {raw!r}")
    if int(raw) > last:
        raise InvalidInput(
            f"{where} {int(raw)} is beyond the end of the event log (its last sequence is "
            f"{last}); resume from at most {last}, or omit it to start at the end",
            {"last_seq": last},
        )
    return int(raw), last


async def _nothing(heartbeat_s: float, free_slot: Callable[[], None]) -> AsyncIterator[bytes]:
    # A caller with no site has no events; the stream says so and stays open like any other.
    try:
        yield b": no sites: nothing to stream\n\n"
        while True:
            await anyio.sleep(heartbeat_s)
            yield b": keepalive\n\n"
    finally:
        free_slot()
