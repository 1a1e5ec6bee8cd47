"""``POST /jobs/kill`` and ``POST /jobs/reset``: one action on every job a filter selects, in
one request.

The jobs are read from the read model, judged by the state machine one by one, and their
events appended pipelined (:meth:`EventLog.append_batch`), each chained on its job's last
sequence as the read model shows it. A job whose compare-and-set fails (it moved on, or the
read model lagged) is re-read and re-judged, a few times; one that no longer matches is left
out, one that keeps changing is reported. At most ``api.max_jobs_per_request`` jobs are acted
on per request; ``more`` says that others match, and calling again acts on them (those acted
on no longer match: a killed job is final, a reset one READY).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Annotated, Final

from fastapi import APIRouter
from pydantic import AwareDatetime, BaseModel, Field, StringConstraints
from sqlalchemy import RowMapping

from lodestream.eventlog import Appended, ConflictError
from lodestream.eventlog.wire import Outgoing
from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import IllegalTransition
from lodestream.schemas.events import JobKilled, JobReset
from lodestream.schemas.events.job import ReasonData
from lodestream.schemas.fold import apply
from lodestream.schemas.resources import APP_NAME_PATTERN
from lodestream.schemas.states import FINAL, NON_FINAL, JobState
from lodestream.schemas.subjects import SITE_SLUG_PATTERN
from lodestream.services.api import appends, queries
from lodestream.services.api.deps import Context, User
from lodestream.services.api.errors import (
    MAX_DETAILS,
    InvalidInput,
    NotFound,
    TooLarge,
    Unauthorized,
    Unavailable,
    documented,
)
from lodestream.services.api.models import FreeText, Wire
from lodestream.services.api.routes.actions import ATTEMPTS, DEFAULT_REASONS, view_of
from lodestream.services.api.routes.jobs import TagFilter, parse_tags
from lodestream.services.api.submit import actor

router = APIRouter(tags=["jobs"])
_ERRORS: Final = documented(Unauthorized, NotFound, TooLarge, InvalidInput, Unavailable)

# The states each action applies to; a filter's states are narrowed to these.
APPLICABLE: Final[dict[type[Event], tuple[str, ...]]] = {
    JobKilled: tuple(sorted(s.value for s in NON_FINAL)),
    JobReset: tuple(sorted(s.value for s in FINAL if s is not JobState.JOB_FINISHED)),
}
VERBS: Final[dict[type[Event], str]] = {JobKilled: "kill", JobReset: "reset"}


class BulkRequest(Wire):
    """Which jobs: all of the criteria given must hold; at least one must be given."""

    ids: list[uuid.UUID] = Field(default_factory=list, max_length=100_000)
    site: Annotated[str, StringConstraints(pattern=SITE_SLUG_PATTERN)] | None = None
    app: Annotated[str, StringConstraints(pattern=APP_NAME_PATTERN)] | None = None
    states: list[JobState] = Field(
        default_factory=list, description="default: every state the action applies to"
    )
    tags: list[TagFilter] = Field(default_factory=list, description="key:value, all must match")
    parent_id: uuid.UUID | None = None
    created_after: AwareDatetime | None = None
    created_before: AwareDatetime | None = None
    reason: FreeText = ""
    limit: int | None = Field(
        None, ge=1, description="at most this many jobs (and api.max_jobs_per_request)"
    )
    dry_run: bool = Field(False, description="count the jobs that match; append nothing")


class BulkRefusal(BaseModel):
    id: uuid.UUID
    reason: str


class BulkDone(BaseModel):
    matched: int = Field(description="jobs selected, in a state the action applies to")
    acted: int = Field(description="jobs killed (or reset) by this request")
    refused: int = Field(description="jobs that kept changing, or that the log did not take")
    gone: int = Field(description="selected jobs that moved on meanwhile and no longer match")
    more: bool = Field(description="more jobs match than one request acts on: call again")
    last_seq: int | None = Field(description="the log sequence of the last event appended")
    refusals: list[BulkRefusal] = Field(description=f"the first {MAX_DETAILS} refused, and why")


@router.post("/jobs/kill", response_model=BulkDone, responses=_ERRORS)
async def kill_jobs(body: BulkRequest, ctx: Context, user: User) -> BulkDone:
    """Kill every job the filter selects that is not final; their pilots stop running tasks."""
    return await _bulk(ctx, user, JobKilled, body)


@router.post("/jobs/reset", response_model=BulkDone, responses=_ERRORS)
async def reset_jobs(body: BulkRequest, ctx: Context, user: User) -> BulkDone:
    """Send every FAILED or KILLED job the filter selects back to READY."""
    return await _bulk(ctx, user, JobReset, body)


async def _bulk(ctx: Context, user: str, kind: type[Event], body: BulkRequest) -> BulkDone:
    selection = await _filter(ctx, user, kind, body)
    limit = min(body.limit or ctx.settings.api.max_jobs_per_request,
                ctx.settings.api.max_jobs_per_request)  # fmt: skip
    async with ctx.engine.connect() as conn:
        rows = await queries.list_jobs(
            conn, user, selection, order_by="created", limit=limit + 1, offset=0
        )
    more, rows = len(rows) > limit, rows[:limit]
    done = BulkDone(matched=len(rows), acted=0, refused=0, gone=0, more=more, last_seq=None,
                    refusals=[])  # fmt: skip
    if body.dry_run or not rows:
        return done
    reason = body.reason or DEFAULT_REASONS[kind]
    refusals: list[BulkRefusal] = []
    last_seq: int | None = None
    acted = 0
    for attempt in range(ATTEMPTS):
        changed, seq, appended, refused = await _append(ctx, user, kind, rows, reason)
        acted += appended
        refusals += refused
        last_seq = max(last_seq or 0, seq or 0) or None
        if not changed:
            break
        await asyncio.sleep(0.05 * (attempt + 1))  # let the projector catch up, then re-judge
        async with ctx.engine.connect() as conn:
            rows = await queries.list_jobs(
                conn, user, queries.JobFilter(ids=changed, states=selection.states),
                order_by="created", limit=len(changed), offset=0,
            )  # fmt: skip
    else:
        refusals += [BulkRefusal(id=r["id"], reason="kept changing; try again") for r in rows]
    return BulkDone(
        matched=done.matched, acted=acted, refused=len(refusals),
        gone=done.matched - acted - len(refusals), more=more, last_seq=last_seq,
        refusals=refusals[:MAX_DETAILS],
    )  # fmt: skip


async def _filter(
    ctx: Context, user: str, kind: type[Event], body: BulkRequest
) -> queries.JobFilter:
    """The read model's filter for ``body``, its states narrowed to those ``kind`` applies to."""
    verb, applicable = VERBS[kind], APPLICABLE[kind]
    criteria = (body.ids, body.site, body.app, body.states, body.tags, body.parent_id,
                body.created_after, body.created_before)  # fmt: skip
    if not any(c for c in criteria):
        raise InvalidInput(
            f"name the jobs to {verb} (ids) or select them (site, app, states, tags, parent_id, "
            f"created_after, created_before); to {verb} every job, give states {list(applicable)}"
        )
    states: list[str] = [s.value for s in body.states if s.value in applicable]
    if not body.states:
        states = list(applicable)
    if not states:
        given = ", ".join(s.value for s in body.states)
        raise InvalidInput(f"{verb} applies to jobs in {', '.join(applicable)}, not {given}")
    if body.site is not None:
        async with ctx.engine.connect() as conn:
            if await queries.site_owner(conn, body.site) != user:
                raise NotFound(f"site {body.site!r} not found")
    return queries.JobFilter(
        site=body.site, app=body.app, states=tuple(states), tags=parse_tags(body.tags, "body.tags"),
        parent_id=body.parent_id, created_after=body.created_after,
        created_before=body.created_before, ids=body.ids,
    )  # fmt: skip


async def _append(
    ctx: Context, user: str, kind: type[Event], rows: Sequence[RowMapping], reason: str
) -> tuple[list[uuid.UUID], int | None, int, list[BulkRefusal]]:
    """Append ``kind`` for each of ``rows`` the state machine allows, pipelined: the jobs whose
    compare-and-set failed (to re-read), the last sequence, how many appended, the refused."""
    messages: list[Outgoing] = []
    refused: list[BulkRefusal] = []
    for row in rows:
        event = kind.create(site=row["site"], aggregate_id=row["id"], actor=actor(user),
                            data=ReasonData(reason=reason))  # fmt: skip
        try:
            apply(view_of(row), event, int(row["last_seq"]) + 1)
        except IllegalTransition as exc:
            refused.append(BulkRefusal(id=row["id"], reason=str(exc)))
            continue
        messages.append(Outgoing.of(event, int(row["last_seq"])))
    too_big = appends.oversized(messages, ctx.nc.max_payload)
    if too_big:
        raise TooLarge(
            f"the reason makes each event {too_big[0][1]} bytes; the event log accepts at most "
            f"{ctx.nc.max_payload}; nothing was appended",
            {"limit": ctx.nc.max_payload, "size": too_big[0][1]},
        )
    changed: list[uuid.UUID] = []
    seq: int | None = None
    appended = 0
    for outcome in await ctx.log.append_batch(messages) if messages else []:
        if isinstance(outcome, Appended):
            appended += 1
            seq = max(seq or 0, outcome.seq)
        elif isinstance(outcome.error, ConflictError):
            changed.append(outcome.event.aggregate_id)
        else:
            refused.append(BulkRefusal(id=outcome.event.aggregate_id, reason=str(outcome.error)))
    return changed, seq, appended, refused
