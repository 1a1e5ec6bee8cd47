"""Data staging, read side: a site's transfer items.

    GET /sites/{name}/transfers    the site's items, in flight by default, newest first

A job's own items come with the job (``GET /jobs/{id}``, ``transfer_items``). Items are
written by the controller (``xfer.requested``) and the site's transfer module (``submitted``,
``succeeded``, ``failed``); the API only reads what the projector folded.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Final, Literal

from fastapi import APIRouter, Path, Query

from lodestream.schemas.resources import TransferState
from lodestream.schemas.subjects import SITE_SLUG_PATTERN
from lodestream.schemas.xfer import FINAL_XFER_STATES
from lodestream.services.api import queries
from lodestream.services.api.deps import Db, User
from lodestream.services.api.errors import (
    InvalidInput,
    NotFound,
    Unauthorized,
    Unavailable,
    documented,
)
from lodestream.services.api.models import TransferItemOut
from lodestream.services.api.strictquery import KnownQuery

router = APIRouter(tags=["transfers"])

MAX_LIST: Final = 1000
IN_FLIGHT: Final = tuple(s for s in TransferState if s not in FINAL_XFER_STATES)

OwnSite = Annotated[str, Path(pattern=SITE_SLUG_PATTERN, description="one of the caller's sites")]
StateFilter = Annotated[
    list[TransferState] | None,
    Query(description="repeatable; default: in flight (pending and submitted)"),
]


@router.get(
    "/sites/{name}/transfers",
    dependencies=[KnownQuery],
    response_model=list[TransferItemOut],
    responses=documented(Unauthorized, NotFound, InvalidInput, Unavailable),
)
async def site_transfers(
    *,
    name: OwnSite,
    user: User,
    db: Db,
    state: StateFilter = None,
    direction: Literal["in", "out"] | None = None,
    job_id: Annotated[uuid.UUID | None, Query(description="only this job's items")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = 100,
) -> list[TransferItemOut]:
    """The site's transfer items, the most recently changed first: those in flight unless
    ``state`` says otherwise. With ``job_id`` and every state, all of a job's items, those of
    earlier staging steps included."""
    if not await queries.is_own_site(db, user, name):
        raise NotFound(f"site {name!r} not found")
    states = tuple(s.value for s in (state or IN_FLIGHT))
    f = queries.TransferFilter(states=states, direction=direction, job_id=job_id)
    rows = await queries.transfers_at_site(db, name, f, limit)
    return [TransferItemOut.from_row(r) for r in rows]
