"""``/jobs/{id}/result`` and ``/jobs/results``: what jobs' runs came to, folded from their
events by the rule the SDK's futures use (``schemas.results``)."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter
from sqlalchemy import RowMapping

from lodestream.schemas.results import fold
from lodestream.schemas.states import FINAL
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.services.api import queries
from lodestream.services.api.deps import Db, User
from lodestream.services.api.errors import (
    InvalidInput,
    NotFound,
    TooLarge,
    Unauthorized,
    Unavailable,
    documented,
)
from lodestream.services.api.models import JobResultOut, ResultsPage, ResultsRequest
from lodestream.services.projector.position import applied_seq

router = APIRouter(tags=["jobs"])


@router.get(
    "/jobs/{job_id}/result",
    response_model=JobResultOut,
    responses=documented(Unauthorized, NotFound, InvalidInput, Unavailable),
)
async def get_result(job_id: uuid.UUID, user: User, db: Db) -> JobResultOut:
    """The job's state and its newest run's outcome: the return value of a Python-function
    app, the exit code and stderr tail of any app, the cause chain of a failure."""
    found, events = await queries.result_rows(db, user, [job_id])
    if not found:
        raise NotFound(f"job {job_id} not found")
    return _results(found, events)[0]


@router.post(
    "/jobs/results",
    response_model=ResultsPage,
    responses=documented(Unauthorized, InvalidInput, TooLarge, Unavailable),
)
async def get_results(body: ResultsRequest, user: User, db: Db) -> ResultsPage:
    """Many jobs' results in one request, with the log position they were read at (what a
    client re-attaching its futures follows the feed from)."""
    # Read first: rows and position are committed together, so these rows hold at least
    # everything up to it.
    position = await applied_seq(db, EVENTS_STREAM)
    ids = list(dict.fromkeys(body.ids))
    found, events = await queries.result_rows(db, user, ids) if ids else ((), ())
    known = {row["id"] for row in found}
    return ResultsPage(
        position=position,
        results=_results(found, events),
        missing=[i for i in ids if i not in known],
    )


def _results(found: Sequence[RowMapping], events: Sequence[RowMapping]) -> list[JobResultOut]:
    by_job: defaultdict[uuid.UUID, list[RowMapping]] = defaultdict(list)
    for event in events:
        by_job[event["job_id"]].append(event)
    out: list[JobResultOut] = []
    for row in found:
        outcome = fold(str(row["id"]), [dict(e) for e in by_job[row["id"]]])
        doc: dict[str, Any] = outcome.to_json()
        # The read model's state is the job's; events folded here are only those of results.
        doc["state"] = row["state"]
        doc["final"] = row["state"] in FINAL
        doc |= {"site": row["site"], "app": row["app"], "workdir": row["workdir"]}
        out.append(JobResultOut.model_validate(doc))
    return out
