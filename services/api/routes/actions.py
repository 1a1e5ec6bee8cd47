"""User actions on one job: kill and reset, judged by the state machine before appending.

The append chains on the job's last sequence as the read model shows it. If
the log has moved past that (the read model lags, or a pilot just reported),
the compare-and-set fails; the action is then re-judged on fresher state, a
few times, before a 409 tells the user the job keeps changing.

The body, a reason, is optional: no body, ``{}`` and ``{"reason": ""}`` all
record a default reason naming the action. A body that is there but
malformed (not JSON, unknown fields, a reason with NUL) is still a 422.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body
from sqlalchemy import RowMapping

from lodestream.eventlog import ConflictError
from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import IllegalTransition
from lodestream.schemas.events import JobKilled, JobReset
from lodestream.schemas.events.job import ReasonData
from lodestream.schemas.fold import JobView, apply
from lodestream.schemas.states import JobState
from lodestream.services.api import appends, queries
from lodestream.services.api.deps import Context, User
from lodestream.services.api.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    TooLarge,
    Unauthorized,
    Unavailable,
    documented,
)
from lodestream.services.api.models import FreeText, Wire
from lodestream.services.api.submit import actor

router = APIRouter(tags=["jobs"])
ATTEMPTS = 5
_ERRORS = documented(Unauthorized, NotFound, Conflict, TooLarge, InvalidInput, Unavailable)


class ActionBody(Wire):
    reason: FreeText = ""


OptionalBody = Annotated[
    ActionBody | None,
    Body(description="Optional. Without it (or without a reason) a default reason is recorded."),
]

# What the event records when the user gives no reason: the actor already says who.
DEFAULT_REASONS: dict[type[Event], str] = {
    JobKilled: "killed on the user's request",
    JobReset: "reset on the user's request",
}


class ActionDone(Wire):
    id: uuid.UUID
    state: str
    seq: int


@router.post("/jobs/{job_id}/kill", response_model=ActionDone, responses=_ERRORS)
async def kill_job(
    job_id: uuid.UUID, ctx: Context, user: User, body: OptionalBody = None
) -> ActionDone:
    """Kill a job that is not final; its pilot stops a running task. The body is optional."""
    return await _act(ctx, user, job_id, JobKilled, body)


@router.post("/jobs/{job_id}/reset", response_model=ActionDone, responses=_ERRORS)
async def reset_job(
    job_id: uuid.UUID, ctx: Context, user: User, body: OptionalBody = None
) -> ActionDone:
    """Send a FAILED or KILLED job back to READY. The body is optional."""
    return await _act(ctx, user, job_id, JobReset, body)


async def _act(
    ctx: Context, user: str, job_id: uuid.UUID, kind: type[Event], body: ActionBody | None
) -> ActionDone:
    reason = (body.reason if body is not None else "") or DEFAULT_REASONS[kind]
    for attempt in range(ATTEMPTS):
        async with ctx.engine.connect() as conn:
            row = await queries.get_job(conn, user, job_id)
        if row is None:
            raise NotFound(f"job {job_id} not found")
        event = kind.create(
            site=row["site"], aggregate_id=job_id, actor=actor(user), data=ReasonData(reason=reason)
        )
        try:
            after = apply(view_of(row), event, int(row["last_seq"]) + 1)
        except IllegalTransition as exc:
            verb = "kill" if kind is JobKilled else "reset"
            raise Conflict(f"cannot {verb} job {job_id}: {exc}") from exc
        appends.ensure_fits(event, int(row["last_seq"]), ctx.nc.max_payload)
        try:
            appended = await ctx.log.append(event, expect=int(row["last_seq"]))
        except ConflictError:
            await asyncio.sleep(0.05 * (attempt + 1))  # let the projector catch up, then re-judge
            continue
        return ActionDone(id=job_id, state=after.state.value, seq=appended.seq)
    raise Conflict(f"job {job_id} kept changing; try again")


def view_of(row: RowMapping) -> JobView:
    """The fold's view of a job as the read model shows it, to judge an action on."""
    stage_times: dict[str, Any] = row["stage_times"] or {}
    return JobView(
        id=row["id"],
        site=row["site"],
        state=JobState(row["state"]),
        last_seq=int(row["last_seq"]),
        lease_seq=row["lease_seq"],
        lease_session=row["lease_session"],
        attempts=int(row["attempts"]),
        stage_times={k: datetime.fromisoformat(v) for k, v in stage_times.items()},
        updated_at=row["updated_at"],
    )
