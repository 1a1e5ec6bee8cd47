"""Pilot batch jobs: ask a site for one, list them, delete one.

    POST   /sites/{site}/batch-jobs    append batch.requested (the site's owner only)
    GET    /sites/{site}/batch-jobs    the site's batch jobs, newest first
    GET    /batch-jobs                 the caller's batch jobs at all their sites
    GET    /batch-jobs/{id}            one batch job
    DELETE /batch-jobs/{id}            append batch.deletion_requested

The API only records the request: the site agent's scheduler module renders the pilot's
script, submits it and reports what the scheduler says (``batch.submitted``, ``queued``,
``running``, ``finished``, or ``submit_failed`` with the scheduler's words). A deletion is
judged by the batch-job lifecycle (``schemas/batch.py``) before it is appended, and chains
on the batch job's last event as the read model shows it; if the site appended meanwhile,
it is judged again on fresher state.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated, Final

from fastapi import APIRouter, Path, Query
from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from lodestream.eventlog import ConflictError
from lodestream.schemas.batch import FINAL_BATCH_STATES, next_batch_state, request_batch_job
from lodestream.schemas.errors import IllegalTransition
from lodestream.schemas.events import BatchJobDeletionRequested
from lodestream.schemas.events.batch import BatchReasonData
from lodestream.schemas.ids import keyed_id
from lodestream.schemas.resources import BatchJobState
from lodestream.schemas.subjects import SITE_SLUG_PATTERN
from lodestream.services.api import appends, queries, submit, waiting
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
from lodestream.services.api.models import BatchJobAccepted, BatchJobCreate, BatchJobOut
from lodestream.services.api.routes.actions import ActionBody, OptionalBody
from lodestream.services.api.strictquery import KnownQuery

router = APIRouter(tags=["batch jobs"])

ATTEMPTS: Final = 5
MAX_LIST: Final = 1000
SiteName = Annotated[str, Path(pattern=SITE_SLUG_PATTERN, description="one of the caller's sites")]
StateFilter = Annotated[list[BatchJobState] | None, Query(description="repeatable")]
Limit = Annotated[int, Query(ge=1, le=MAX_LIST)]


@router.post(
    "/sites/{site}/batch-jobs",
    status_code=201,
    response_model=BatchJobAccepted,
    responses=documented(
        Unauthorized, NotFound, Conflict, TooLarge, InvalidInput, Unavailable, NotYetProjected
    ),
)
async def request_pilot(
    site: SiteName,
    body: BatchJobCreate,
    ctx: Context,
    user: User,
    *,
    wait: bool = False,
    wait_timeout: Annotated[float | None, Query(gt=0, allow_inf_nan=False)] = None,
) -> BatchJobAccepted:
    """Ask ``site`` for a pilot batch job; its agent submits it to the site's scheduler.

    With ``idempotency_key`` a retried request returns the same batch job and appends
    nothing; with ``wait`` it returns once the batch job is visible in reads.
    """
    budget = waiting.wait_budget(wait_timeout, ctx.settings.api.wait_timeout_s)
    async with ctx.engine.connect() as conn:
        await _own_site(conn, user, site)
    batch_id = event_id = None
    if body.idempotency_key is not None:
        secret = submit.id_secret(ctx.settings)
        batch_id = keyed_id(secret, "batch", user, body.idempotency_key)
        event_id = keyed_id(secret, "batch.requested", str(batch_id), body.idempotency_key)
    event = request_batch_job(
        site, body.request(), actor=submit.actor(user), batch_id=batch_id, event_id=event_id
    )
    appends.ensure_fits(event, 0, ctx.nc.max_payload)
    try:  # a retry of one that had landed is a duplicate: the log recognises it
        appended = await ctx.log.append(event, expect=0)
    except ConflictError as exc:
        raise Conflict(f"batch job {event.aggregate_id} exists") from exc
    seq, duplicate = appended.seq, appended.duplicate
    accepted = BatchJobAccepted(
        id=event.aggregate_id, site=site, state="requested", seq=seq, duplicate=duplicate
    )
    if wait:
        await waiting.until_projected(ctx.engine, seq, budget, accepted.model_dump(mode="json"))
    return accepted


@router.get(
    "/sites/{site}/batch-jobs",
    dependencies=[KnownQuery],
    response_model=list[BatchJobOut],
    responses=documented(Unauthorized, NotFound, InvalidInput, Unavailable),
)
async def list_site_batch_jobs(
    site: SiteName, user: User, db: Db, state: StateFilter = None, limit: Limit = 100
) -> list[BatchJobOut]:
    """The site's batch jobs, newest first."""
    await _own_site(db, user, site)
    rows = await queries.list_batch_jobs(db, user, site=site, states=state or (), limit=limit)
    return [BatchJobOut.from_row(r) for r in rows]


@router.get(
    "/batch-jobs",
    dependencies=[KnownQuery],
    response_model=list[BatchJobOut],
    responses=documented(Unauthorized, InvalidInput, Unavailable),
)
async def list_batch_jobs(
    user: User,
    db: Db,
    site: Annotated[str | None, Query(pattern=SITE_SLUG_PATTERN)] = None,
    state: StateFilter = None,
    limit: Limit = 100,
) -> list[BatchJobOut]:
    """The caller's batch jobs at all their sites (or one), newest first."""
    rows = await queries.list_batch_jobs(db, user, site=site, states=state or (), limit=limit)
    return [BatchJobOut.from_row(r) for r in rows]


@router.get(
    "/batch-jobs/{batch_id}",
    response_model=BatchJobOut,
    responses=documented(Unauthorized, NotFound, InvalidInput, Unavailable),
)
async def get_batch_job(batch_id: uuid.UUID, user: User, db: Db) -> BatchJobOut:
    row = await queries.get_batch_job(db, user, batch_id)
    if row is None:
        raise NotFound(f"batch job {batch_id} not found")
    return BatchJobOut.from_row(row)


@router.delete(
    "/batch-jobs/{batch_id}",
    response_model=BatchJobAccepted,
    responses=documented(Unauthorized, NotFound, Conflict, TooLarge, InvalidInput, Unavailable),
)
async def delete_batch_job(
    batch_id: uuid.UUID, ctx: Context, user: User, body: OptionalBody = None
) -> BatchJobAccepted:
    """Ask the site to delete a batch job at its scheduler (a running pilot is stopped and
    its jobs drained); 409 once it has ended. Asking again is no error. The body is optional.
    """
    reason = (body.reason if isinstance(body, ActionBody) else "") or f"deleted by {user}"
    for attempt in range(ATTEMPTS):
        async with ctx.engine.connect() as conn:
            row = await queries.get_batch_job(conn, user, batch_id)
        if row is None:
            raise NotFound(f"batch job {batch_id} not found")
        state = BatchJobState(row["state"])
        if state is BatchJobState.DELETION_REQUESTED:
            return _accepted(row, int(row["last_seq"]), duplicate=True)
        try:
            next_batch_state(state, "batch.deletion_requested")
        except IllegalTransition as exc:
            ended = "has ended" if state in FINAL_BATCH_STATES else f"is {state.value}"
            raise Conflict(f"batch job {batch_id} {ended}: nothing to delete") from exc
        event = BatchJobDeletionRequested.create(
            site=row["site"], aggregate_id=batch_id, actor=submit.actor(user),
            data=BatchReasonData(reason=reason),
        )  # fmt: skip
        appends.ensure_fits(event, int(row["last_seq"]), ctx.nc.max_payload)
        try:
            appended = await ctx.log.append(event, expect=int(row["last_seq"]))
        except ConflictError:
            await asyncio.sleep(0.05 * (attempt + 1))  # let the projector catch up, then re-judge
            continue
        return _accepted(row, appended.seq)
    raise Conflict(f"batch job {batch_id} kept changing; try again")


async def _own_site(conn: AsyncConnection, user: str, site: str) -> None:
    """404 unless ``site`` is one of the caller's live sites (another's is not found either)."""
    owned = await queries.list_sites(conn, user, include_removed=False)
    if not any(row["name"] == site for row in owned):
        raise NotFound(f"site {site!r} not found")


def _accepted(row: RowMapping, seq: int, *, duplicate: bool = False) -> BatchJobAccepted:
    return BatchJobAccepted(
        id=row["id"], site=row["site"], state=BatchJobState.DELETION_REQUESTED.value, seq=seq,
        duplicate=duplicate,
    )  # fmt: skip
