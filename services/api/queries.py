"""Read queries over the read models (SQLAlchemy Core), always scoped to one owner.

Every list query is shaped for an index of ``infra/postgres/tables.py``:
``owner`` first, ``state`` by equality, tags by ``@>`` (GIN, jsonb_path_ops),
``parent_ids`` by ``@>`` (GIN) and order by ``created_seq``. Id lists are
bound as one array parameter (``= ANY(%s)``), not thousands of placeholders.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal

from sqlalchemy import ColumnElement, FromClause, RowMapping, Select, any_, bindparam, select
from sqlalchemy.dialects.postgresql import ARRAY, UUID, distinct_on
from sqlalchemy.ext.asyncio import AsyncConnection

from lodestream.infra.postgres.tables import (
    api_tokens,
    apps,
    batch_jobs,
    job_events,
    jobs,
    scaler_decisions,
    scalers,
    sites,
    transfer_items,
)
from lodestream.schemas.results import RESULT_EVENTS
from lodestream.services.api.capacity import RunTimes
from lodestream.services.api.jobids import id_conditions
from lodestream.services.api.loads import site_loads
from lodestream.services.api.submit import AppInterface, Catalog, Existing

OrderBy = Literal["created", "-created", "updated", "-updated"]

_UUIDS: Final = ARRAY(UUID(as_uuid=True))
WALK_WINDOW: Final = 5000
_ORDER: Final[dict[str, tuple[ColumnElement[Any], ...]]] = {
    "created": (jobs.c.created_seq.asc(),),
    "-created": (jobs.c.created_seq.desc(),),
    "updated": (jobs.c.updated_at.asc(), jobs.c.created_seq.asc()),
    "-updated": (jobs.c.updated_at.desc(), jobs.c.created_seq.desc()),
}


def _ids(name: str, values: Collection[uuid.UUID]) -> ColumnElement[Any]:
    return any_(bindparam(name, list(values), type_=_UUIDS))


async def user_for_token(conn: AsyncConnection, token_hash: str) -> str | None:
    result = await conn.execute(
        select(api_tokens.c.user_name).where(
            api_tokens.c.token_hash == token_hash, api_tokens.c.revoked_at.is_(None)
        )
    )
    name: str | None = result.scalar_one_or_none()
    return name


# --- submission ------------------------------------------------------------------------------


async def catalog(
    conn: AsyncConnection,
    owner: str,
    *,
    site_names: Collection[str],
    parents: Collection[uuid.UUID],
    ids: Collection[uuid.UUID] | None,
    stages: bool = False,
    auto: bool = False,
    now: datetime | None = None,
) -> Catalog:
    """Everything a submission is checked against, in at most five queries (the sites'
    transfer locations only when a job of it ``stages`` data). With ``auto`` (a job lets the
    API choose its site) every live site of the owner is loaded, with its load as of ``now``
    (four more queries, :func:`lodestream.services.api.loads.site_loads`)."""
    query = select(sites.c.name).where(sites.c.owner == owner, sites.c.removed_at.is_(None))
    if not auto:
        query = query.where(sites.c.name.in_(sorted(site_names)))
    result = await conn.execute(query)
    own_sites = frozenset(result.scalars())
    locations: dict[str, frozenset[str]] = {}
    if own_sites and stages:
        result = await conn.execute(
            select(sites.c.name, sites.c.transfer_locations).where(
                sites.c.name.in_(sorted(own_sites))
            )
        )
        locations = {name: frozenset(declared or {}) for name, declared in result}
    app_map: dict[str, dict[str, AppInterface]] = {}
    if own_sites:
        result = await conn.execute(
            select(
                apps.c.site, apps.c.name, apps.c.parameters, apps.c.transfers, apps.c.hooks,
                apps.c.python,
            ).where(apps.c.site.in_(sorted(own_sites)))
        )  # fmt: skip
        for site, name, parameters, transfers, hooks, python in result:
            app_map.setdefault(site, {})[name] = AppInterface.from_row(
                parameters, transfers, hooks, python
            )
    own_jobs: frozenset[uuid.UUID] = frozenset()
    if parents:
        result = await conn.execute(
            select(jobs.c.id).where(jobs.c.owner == owner, jobs.c.id == _ids("parents", parents))
        )
        own_jobs = frozenset(result.scalars())
    existing: dict[uuid.UUID, Existing] = {}
    if ids:
        # Any owner: an id is global. The created event tells a retry from a clash.
        result = await conn.execute(
            select(jobs.c.id, jobs.c.owner, jobs.c.created_seq, job_events.c.event_id)
            .select_from(jobs.outerjoin(job_events, job_events.c.seq == jobs.c.created_seq))
            .where(jobs.c.id == _ids("ids", ids))
        )
        existing = {row.id: Existing(row.owner, row.event_id, row.created_seq) for row in result}
    loads, runs = (
        await site_loads(conn, owner, own_sites, now) if auto and own_sites else ({}, RunTimes())
    )
    return Catalog(
        sites=own_sites,
        apps=app_map,
        own_jobs=own_jobs,
        existing=existing,
        locations=locations,
        loads=loads,
        runs=runs,
    )


# --- jobs and events -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobFilter:
    site: str | None = None
    app: str | None = None
    states: Sequence[str] = ()
    tags: dict[str, str] = field(default_factory=dict)
    parent_id: uuid.UUID | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    updated_after: datetime | None = None
    updated_before: datetime | None = None
    id_prefix: str | None = None  # hex digits, as schemas.ids.id_part gives them
    id_suffix: str | None = None
    ids: Sequence[uuid.UUID] = ()  # only these jobs (a bulk action's named jobs)


def _conditions(owner: str, f: JobFilter) -> list[ColumnElement[bool]]:
    """The conditions the B-tree indexes can answer."""
    plain: list[ColumnElement[bool]] = [jobs.c.owner == owner]
    if f.site is not None:
        plain.append(jobs.c.site == f.site)
    if f.app is not None:
        plain.append(jobs.c.app == f.app)
    plain.extend(id_conditions(f.id_prefix, f.id_suffix))
    if f.ids:
        plain.append(jobs.c.id == _ids("ids", f.ids))
    if len(f.states) == 1:
        plain.append(jobs.c.state == f.states[0])
    elif f.states:
        plain.append(jobs.c.state.in_(f.states))
    for column, after, before in (
        (jobs.c.created_at, f.created_after, f.created_before),
        (jobs.c.updated_at, f.updated_after, f.updated_before),
    ):
        if after is not None:
            plain.append(column > after)
        if before is not None:
            plain.append(column < before)
    return plain


def _containment(f: JobFilter, table: FromClause = jobs) -> list[ColumnElement[bool]]:
    """The conditions the GIN indexes answer, on ``table`` (``rm.jobs`` or a subquery of it)."""
    contained: list[ColumnElement[bool]] = []
    if f.tags:
        contained.append(table.c.tags.contains(f.tags))  # one @> for all tags: one GIN probe
    if f.parent_id is not None:
        contained.append(table.c.parent_ids.contains([f.parent_id]))
    return contained


def jobs_query(owner: str, f: JobFilter, order_by: OrderBy, limit: int, offset: int) -> Select[Any]:
    query = select(jobs).where(*_conditions(owner, f), *_containment(f)).limit(limit).offset(offset)
    return query.order_by(*_ORDER[order_by])


async def list_jobs(
    conn: AsyncConnection, owner: str, f: JobFilter, *, order_by: OrderBy, limit: int, offset: int
) -> Sequence[RowMapping]:
    """One page of the owner's jobs.

    With a tag or parent filter and creation order, no single plan is good
    for every filter: walking (owner, state, created_seq) and filtering is
    fast when matches are everywhere, and scans most of the index when they
    are old (tags are usually per campaign, so they cluster in time); the
    GIN bitmap is fast for a rare tag and slow for a common one. Postgres
    estimates how many rows match, not where they are, so we try the walk
    over the newest ``WALK_WINDOW`` candidates first and fall back to the
    bitmap (ordering by an expression keeps the planner off the ordered
    index) only when that window does not fill the page.
    """
    plain, contained = _conditions(owner, f), _containment(f)
    if not contained or order_by not in {"created", "-created"}:
        return await _rows(conn, jobs_query(owner, f, order_by, limit, offset))
    order = _ORDER[order_by][0]
    window = select(jobs).where(*plain).order_by(order).limit(WALK_WINDOW).subquery()
    walk = (
        select(window)
        .where(*_containment(f, window))
        .order_by(window.c.created_seq.desc() if order_by == "-created" else window.c.created_seq)
        .limit(limit)
        .offset(offset)
    )
    rows = await _rows(conn, walk)
    if len(rows) == limit:
        return rows
    seq = jobs.c.created_seq + 0
    bitmap = (
        select(jobs)
        .where(*plain, *contained)
        .order_by(seq.desc() if order_by == "-created" else seq)
        .limit(limit)
        .offset(offset)
    )
    return await _rows(conn, bitmap)


async def _rows(conn: AsyncConnection, query: Select[Any]) -> Sequence[RowMapping]:
    result = await conn.execute(query)
    rows: Sequence[RowMapping] = result.mappings().all()
    return rows


async def get_job(conn: AsyncConnection, owner: str, job_id: uuid.UUID) -> RowMapping | None:
    result = await conn.execute(select(jobs).where(jobs.c.id == job_id, jobs.c.owner == owner))
    return result.mappings().one_or_none()


async def events_of_job(conn: AsyncConnection, job_id: uuid.UUID) -> Sequence[RowMapping]:
    result = await conn.execute(
        select(job_events).where(job_events.c.job_id == job_id).order_by(job_events.c.seq)
    )
    return result.mappings().all()


async def result_rows(
    conn: AsyncConnection, owner: str, job_ids: Sequence[uuid.UUID]
) -> tuple[Sequence[RowMapping], Sequence[RowMapping]]:
    """The owner's jobs among ``job_ids`` (id, state, site, app, workdir) and their events
    that a result is folded from (``schemas.results.RESULT_EVENTS``), in log order."""
    found = await conn.execute(
        select(jobs.c.id, jobs.c.state, jobs.c.site, jobs.c.app, jobs.c.workdir).where(
            jobs.c.id.in_(job_ids), jobs.c.owner == owner
        )
    )
    rows = found.mappings().all()
    events = await conn.execute(
        select(job_events.c.job_id, job_events.c.type, job_events.c.data, job_events.c.to_state)
        .where(
            job_events.c.job_id.in_([r["id"] for r in rows]),
            job_events.c.type.in_(sorted(RESULT_EVENTS)),
        )
        .order_by(job_events.c.seq)
    )
    return rows, events.mappings().all()


async def events_after(
    conn: AsyncConnection, owner: str, after_seq: int, up_to: int, limit: int
) -> Sequence[RowMapping]:
    """Events of the owner's jobs with ``after_seq < seq <= up_to``, ascending."""
    result = await conn.execute(
        select(job_events)
        .join(jobs, jobs.c.id == job_events.c.job_id)
        .where(jobs.c.owner == owner, job_events.c.seq > after_seq, job_events.c.seq <= up_to)
        .order_by(job_events.c.seq)
        .limit(limit)
    )
    return result.mappings().all()


# --- sites and apps --------------------------------------------------------------------------


async def list_sites(
    conn: AsyncConnection, owner: str, *, include_removed: bool
) -> Sequence[RowMapping]:
    query = select(sites).where(sites.c.owner == owner).order_by(sites.c.name)
    if not include_removed:
        query = query.where(sites.c.removed_at.is_(None))
    result = await conn.execute(query)
    return result.mappings().all()


async def is_own_site(conn: AsyncConnection, owner: str, name: str) -> bool:
    """Whether ``name`` is one of the owner's live sites."""
    result = await conn.execute(
        select(sites.c.name).where(
            sites.c.name == name, sites.c.owner == owner, sites.c.removed_at.is_(None)
        )
    )
    return result.first() is not None


async def site_owner(conn: AsyncConnection, name: str) -> str | None:
    result = await conn.execute(select(sites.c.owner).where(sites.c.name == name))
    owner: str | None = result.scalar_one_or_none()
    return owner


async def list_apps(conn: AsyncConnection, owner: str, site: str | None) -> Sequence[RowMapping]:
    own = select(sites.c.name).where(sites.c.owner == owner, sites.c.removed_at.is_(None))
    if site is not None:
        own = own.where(sites.c.name == site)
    result = await conn.execute(
        select(apps).where(apps.c.site.in_(own)).order_by(apps.c.site, apps.c.name)
    )
    return result.mappings().all()


async def scaler(conn: AsyncConnection, site: str) -> RowMapping | None:
    """The site's elastic queue as the read model has it: its newest backlog; None if none."""
    result = await conn.execute(select(scalers).where(scalers.c.site == site))
    return result.mappings().one_or_none()


async def scaler_decisions_of(conn: AsyncConnection, site: str, limit: int) -> Sequence[RowMapping]:
    """The site's newest decisions, newest first (index scaler_decisions_site)."""
    result = await conn.execute(
        select(scaler_decisions)
        .where(scaler_decisions.c.site == site)
        .order_by(scaler_decisions.c.seq.desc())
        .limit(limit)
    )
    return result.mappings().all()


# --- pilot batch jobs --------------------------------------------------------------------


def _own_sites(owner: str) -> Select[Any]:
    return select(sites.c.name).where(sites.c.owner == owner, sites.c.removed_at.is_(None))


async def list_batch_jobs(
    conn: AsyncConnection,
    owner: str,
    *,
    site: str | None = None,
    states: Sequence[str] = (),
    limit: int = 100,
) -> Sequence[RowMapping]:
    """The owner's batch jobs, newest first (``batch_jobs_site_state`` serves a site's)."""
    query = select(batch_jobs).where(batch_jobs.c.site.in_(_own_sites(owner)))
    if site is not None:
        query = query.where(batch_jobs.c.site == site)
    if states:
        query = query.where(batch_jobs.c.state.in_(list(states)))
    query = query.order_by(batch_jobs.c.created_at.desc(), batch_jobs.c.id).limit(limit)
    return await _rows(conn, query)


async def get_batch_job(
    conn: AsyncConnection, owner: str, batch_id: uuid.UUID
) -> RowMapping | None:
    result = await conn.execute(
        select(batch_jobs).where(
            batch_jobs.c.id == batch_id, batch_jobs.c.site.in_(_own_sites(owner))
        )
    )
    return result.mappings().one_or_none()


# --- transfer items ---------------------------------------------------------------------------


async def transfers_of_job(
    conn: AsyncConnection, site: str, job_id: uuid.UUID
) -> Sequence[RowMapping]:
    """The item of the newest step of each of the job's slots, stage-in first, by slot
    (index transfer_items_job). The newest step is the one requested last: a job is staged
    again only after its earlier step has ended."""
    items = transfer_items.c
    query = (
        select(transfer_items)
        .where(items.job_id == job_id, items.site == site)
        .ext(distinct_on(items.direction, items.slot))
        .order_by(
            items.direction, items.slot, items.requested_at.desc().nulls_last(),
            items.last_seq.desc(),
        )
    )  # fmt: skip
    return await _rows(conn, query)


@dataclass(frozen=True, slots=True)
class TransferFilter:
    states: Sequence[str]
    direction: str | None = None
    job_id: uuid.UUID | None = None


async def transfers_at_site(
    conn: AsyncConnection, site: str, f: TransferFilter, limit: int
) -> Sequence[RowMapping]:
    """The site's items in ``f.states``, most recently changed first (index
    transfer_items_site_state; transfer_items_job with a job)."""
    items = transfer_items.c
    query = select(transfer_items).where(items.site == site, items.state.in_(list(f.states)))
    if f.direction is not None:
        query = query.where(items.direction == f.direction)
    if f.job_id is not None:
        query = query.where(items.job_id == f.job_id)
    return await _rows(conn, query.order_by(items.updated_at.desc(), items.id).limit(limit))
