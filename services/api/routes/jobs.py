"""``/jobs``: bulk submission (append ``job.created``) and reads of the jobs read model."""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from typing import Annotated, Final

from fastapi import APIRouter, Query, Request, Response
from pydantic import AwareDatetime, StringConstraints, ValidationError, WithJsonSchema

from lodestream.eventlog.wire import Outgoing
from lodestream.schemas.envelope import now
from lodestream.schemas.ids import MIN_ID_PART, id_part
from lodestream.schemas.resources import APP_NAME_PATTERN
from lodestream.schemas.states import JobState
from lodestream.schemas.subjects import SITE_SLUG_PATTERN
from lodestream.services.api import appends, queries, submit, waiting
from lodestream.services.api.appends import Accepted, Refused
from lodestream.services.api.deps import Context, Db, User
from lodestream.services.api.errors import (
    MAX_DETAILS,
    TAG_FILTER_RULE,
    Conflict,
    InvalidInput,
    NotFound,
    NotYetProjected,
    TooLarge,
    TooManyJobs,
    Unauthorized,
    Unavailable,
    documented,
    invalid_from_errors,
)
from lodestream.services.api.models import (
    MAX_PAGE_SIZE,
    SEQ_MAX,
    TAG_FILTER_MAX_LENGTH,
    TAG_FILTER_PATTERN,
    TOO_MANY_JOBS,
    JobDetail,
    JobEventOut,
    JobOut,
    JobPage,
    SubmitRequest,
    SubmitResponse,
    SubmittedJob,
    TransferItemOut,
    inline_schema,
)
from lodestream.services.api.strictquery import KnownQuery

router = APIRouter(tags=["jobs"])

TAG_HELP: Final = "key:value, repeatable; a job matches when it has all of them"
ID_PART_HELP: Final = (
    f"at least {MIN_ID_PART} hex digits: jobs whose id begins (id_prefix) or ends (id_suffix) "
    "with them"
)
# Checked by parse_tags, not by the query's pattern: a ``key=value`` is told its right form.
TagFilter = Annotated[
    str,
    StringConstraints(max_length=TAG_FILTER_MAX_LENGTH),
    WithJsonSchema({"type": "string", "pattern": TAG_FILTER_PATTERN}),
]
_TAG_FILTER: Final = re.compile(TAG_FILTER_PATTERN)

_SUBMIT_BODY: Final = {
    "required": True,
    "content": {"application/json": {"schema": inline_schema(SubmitRequest)}},
}


def parse_submission(body: bytes, max_jobs: int) -> SubmitRequest:
    """Validate the raw body in one pass (JSON parsing included) with the job-count limit."""
    try:
        return SubmitRequest.model_validate_json(body, context={"max_jobs": max_jobs})
    except ValidationError as exc:
        errors = exc.errors()
        for err in errors:
            if err["type"] == TOO_MANY_JOBS:
                raise TooManyJobs(err["msg"], {"limit": max_jobs}) from exc
        raise invalid_from_errors(
            [{**err, "loc": ("body", *err["loc"])} for err in errors], "invalid submission"
        ) from exc


@router.post(
    "/jobs",
    status_code=202,
    response_model=SubmitResponse,
    openapi_extra={"requestBody": _SUBMIT_BODY},
    responses={
        201: {"model": SubmitResponse, "description": "accepted and projected (wait)"},
        **documented(
            Unauthorized, NotFound, Conflict, TooLarge, InvalidInput, Unavailable, NotYetProjected
        ),
    },
)
async def submit_jobs(
    *,
    request: Request,
    response: Response,
    ctx: Context,
    user: User,
    wait: bool = False,
    wait_timeout: Annotated[float | None, Query(gt=0, allow_inf_nan=False)] = None,
) -> SubmitResponse:
    """Append one ``job.created`` per job, or nothing when any job is invalid or too large."""
    budget = waiting.wait_budget(wait_timeout, ctx.settings.api.wait_timeout_s)
    submission = parse_submission(await request.body(), ctx.settings.api.max_jobs_per_request)
    secret = submit.id_secret(ctx.settings)
    ids = submit.job_ids(submission, user, secret)
    async with ctx.engine.connect() as conn:
        catalog = await queries.catalog(
            conn,
            user,
            site_names=submit.named_sites(submission),
            parents=submit.outside_parents(submission, ids),
            ids=ids if submit.needs_existence_check(submission) else None,
            stages=any(job.transfers for job in submission.jobs),
            auto=submit.has_auto(submission),
            now=now(),
        )
    submission = submit.resolve_auto(submission, catalog)
    submit.check(submission, ids, catalog)
    plan = submit.build_events(submission, ids, catalog, user=user, now=now(), secret=secret)
    # Encoded once: measured against max_payload, then sent as measured.
    messages = [Outgoing.of(event, 0) for event in plan.to_append]
    _ensure_fit(messages, ids, ctx.nc.max_payload)
    outcomes = iter(await appends.append_created(ctx.log, messages))
    results: list[Accepted | Refused] = [
        Accepted(ids[i], plan.already[i].created_seq, True) if i in plan.already else next(outcomes)
        for i in range(len(ids))
    ]
    accepted = _accepted_or_raise(results, submission.idempotency_key is not None)
    if wait:
        await waiting.until_projected(
            ctx.engine, accepted.last_seq, budget, accepted.model_dump(mode="json")
        )
        response.status_code = 201
    return accepted


def _ensure_fit(messages: Sequence[Outgoing], ids: Sequence[uuid.UUID], limit: int) -> None:
    """Raise TooLarge naming the jobs that are over the log's message size limit."""
    too_big = appends.oversized(messages, limit)
    if not too_big:
        return
    index = {job_id: i for i, job_id in enumerate(ids)}
    jobs = [{"index": index[messages[p].event.aggregate_id], "size": size} for p, size in too_big]
    first = jobs[0]
    more = f" (and {len(jobs) - 1} more)" if len(jobs) > 1 else ""
    raise TooLarge(
        f"jobs[{first['index']}] would be a {first['size']}-byte event{more}; the event log "
        f"accepts at most {limit} bytes per event (NATS max_payload): keep large inputs in "
        "files and pass their paths; nothing was appended",
        {"limit": limit, "jobs": jobs[:MAX_DETAILS]},
    )


def _accepted_or_raise(results: list[Accepted | Refused], keyed: bool) -> SubmitResponse:
    refused = [(i, r) for i, r in enumerate(results) if isinstance(r, Refused)]
    done = [
        SubmittedJob(id=r.id, seq=r.seq, duplicate=r.duplicate)
        for r in results
        if isinstance(r, Accepted)
    ]
    if not refused:
        return SubmitResponse(jobs=done, last_seq=max(j.seq for j in done))
    retry = (
        "retrying with the same idempotency_key completes it"
        if keyed
        else "resubmit only the refused jobs"
    )
    index, first = refused[0]
    message = (
        f"{len(refused)} of {len(results)} jobs were not appended (jobs[{index}]: {first.reason}); "
        f"{len(done)} were accepted — {retry}"
    )
    details = {
        "accepted": [j.model_dump(mode="json") for j in done],
        "refused": [{"index": i, "id": str(r.id), "reason": r.reason} for i, r in refused],
    }
    if any(r.conflict for _, r in refused):
        raise Conflict(message, details)
    raise Unavailable(message, details)


@router.get(
    "/jobs",
    response_model=JobPage,
    responses=documented(Unauthorized, NotFound, InvalidInput, Unavailable),
    dependencies=[KnownQuery],
)
async def list_jobs(
    *,
    user: User,
    db: Db,
    ctx: Context,
    site: Annotated[str | None, Query(pattern=SITE_SLUG_PATTERN)] = None,
    app: Annotated[str | None, Query(pattern=APP_NAME_PATTERN)] = None,
    state: Annotated[list[JobState] | None, Query()] = None,
    tag: Annotated[list[TagFilter] | None, Query(description=TAG_HELP)] = None,
    parent_id: uuid.UUID | None = None,
    id_prefix: Annotated[str | None, Query(description=ID_PART_HELP, max_length=36)] = None,
    id_suffix: Annotated[str | None, Query(description=ID_PART_HELP, max_length=36)] = None,
    created_after: Annotated[AwareDatetime | None, Query()] = None,
    created_before: Annotated[AwareDatetime | None, Query()] = None,
    updated_after: Annotated[AwareDatetime | None, Query()] = None,
    updated_before: Annotated[AwareDatetime | None, Query()] = None,
    order_by: queries.OrderBy = "-created",
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = 100,
    offset: Annotated[int, Query(ge=0, le=SEQ_MAX)] = 0,
) -> JobPage:
    if limit > ctx.settings.api.max_page_size:
        raise InvalidInput(f"limit must be at most {ctx.settings.api.max_page_size}, got {limit}")
    if site is not None and await queries.site_owner(db, site) != user:
        raise NotFound(f"site {site!r} not found")  # as submit says it, another's site too
    filters = queries.JobFilter(
        site=site,
        app=app,
        states=tuple(s.value for s in state or ()),
        tags=parse_tags(tag or []),
        parent_id=parent_id,
        created_after=created_after,
        created_before=created_before,
        updated_after=updated_after,
        updated_before=updated_before,
        id_prefix=_id_part("id_prefix", id_prefix),
        id_suffix=_id_part("id_suffix", id_suffix),
    )
    # One row more than asked says whether there is a next page without a count(*).
    rows = await queries.list_jobs(
        db, user, filters, order_by=order_by, limit=limit + 1, offset=offset
    )
    return JobPage(
        items=[JobOut.from_row(r) for r in rows[:limit]],
        next_offset=offset + limit if len(rows) > limit else None,
    )


def _id_part(name: str, value: str | None) -> str | None:
    if value is None:
        return None
    digits = id_part(value)
    if digits is None:
        raise InvalidInput(
            f"{name} must be at least {MIN_ID_PART} hex digits of a job id, got {value!r}"
        )
    return digits


def parse_tags(raw: list[str], where: str = "query.tag") -> dict[str, str]:
    """``key:value`` filters → ``{key: value}``; a ``key=value`` is refused with its right
    form (the message says where: ``query.tag.0``, ``body.tags.1``)."""
    tags: dict[str, str] = {}
    for n, item in enumerate(raw):
        if not _TAG_FILTER.fullmatch(item):
            key, eq, value = item.partition("=")
            hint = f"; write {key}:{value}" if eq and key and ":" not in key else ""
            raise InvalidInput(
                f"invalid request: {where}.{n}: {TAG_FILTER_RULE}, got {item!r}{hint}"
            )
        key, _, value = item.partition(":")
        if tags.setdefault(key, value) != value:
            raise InvalidInput(f"tag {key!r} is given twice with different values")
    return tags


@router.get(
    "/jobs/{job_id}",
    response_model=JobDetail,
    responses=documented(Unauthorized, NotFound, InvalidInput, Unavailable),
)
async def get_job(job_id: uuid.UUID, user: User, db: Db) -> JobDetail:
    """One job, with the transfer items of its newest staging step (see ``JobDetail``)."""
    row = await queries.get_job(db, user, job_id)
    if row is None:
        raise NotFound(f"job {job_id} not found")
    items = await queries.transfers_of_job(db, row["site"], job_id)
    return JobDetail.model_validate(
        {**dict(row), "transfer_items": [TransferItemOut.from_row(i) for i in items]}
    )


@router.get(
    "/jobs/{job_id}/events",
    response_model=list[JobEventOut],
    responses=documented(Unauthorized, NotFound, InvalidInput, Unavailable),
)
async def get_job_events(job_id: uuid.UUID, user: User, db: Db) -> list[JobEventOut]:
    if await queries.get_job(db, user, job_id) is None:
        raise NotFound(f"job {job_id} not found")
    return [JobEventOut.from_row(r) for r in await queries.events_of_job(db, job_id)]
