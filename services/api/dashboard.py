"""The dashboard's starting point: one consistent snapshot of the read models, and its position.

The snapshot is read in one REPEATABLE READ transaction, position first: the projector
commits rows and position together, so the counts are exactly the fold of the log up to
``position``, and the dashboard's feed resumes after it (``since=position``) without
counting an event twice or missing one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.dialects.postgresql import distinct_on
from sqlalchemy.ext.asyncio import AsyncEngine

from lodestream.infra.postgres.tables import job_events, jobs, sessions, sites
from lodestream.schemas.states import FINAL, TRANSITIONS
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.services.projector.position import applied_seq

MAX_TRACKED_JOBS: Final = 20_000  # unfinished jobs whose state the page follows one by one
RECENT_FAILURES: Final = 20
# A run that errored is a failure to show even while its site decides whether to retry it.
FAILURES: Final = ("FAILED", "RUN_ERROR")

TARGETS: Final = {t.event: (t.target.value if t.target else None) for t in TRANSITIONS.values()}
"""Each job event type and the state it leads to (None: the state does not change)."""


def cores_of(placement: Any) -> int:
    """Cores a started job holds, from ``job.started``'s placement (1 when it names none)."""
    if not isinstance(placement, list):
        return 1
    cores = sum(len(p.get("cores") or ()) for p in placement if isinstance(p, dict))
    return max(cores, 1)


def selection(
    owner: str, app: str | None = None, tags: Mapping[str, str] | None = None
) -> list[ColumnElement[bool]]:
    """The owner's jobs, of ``app`` and with all of ``tags`` when given (``lode watch``'s
    ``--app`` and ``--tag``)."""
    where = [jobs.c.owner == owner]
    if app is not None:
        where.append(jobs.c.app == app)
    if tags:
        where.append(jobs.c.tags.contains(dict(tags)))
    return where


async def snapshot(
    engine: AsyncEngine, owner: str, app: str | None = None, tags: Mapping[str, str] | None = None
) -> dict[str, Any]:
    mine = selection(owner, app, tags)
    async with engine.connect() as plain:
        conn = await plain.execution_options(isolation_level="REPEATABLE READ")
        async with conn.begin():
            position = await applied_seq(conn, EVENTS_STREAM)
            own = select(sites.c.name).where(sites.c.owner == owner, sites.c.removed_at.is_(None))
            names = [r[0] for r in (await conn.execute(own.order_by(sites.c.name))).all()]
            counts = await conn.execute(
                select(jobs.c.site, jobs.c.state, func.count())
                .where(*mine)
                .group_by(jobs.c.site, jobs.c.state)
            )
            unfinished = await conn.execute(
                select(jobs.c.id, jobs.c.site, jobs.c.state)
                .where(*mine, jobs.c.state.not_in([s.value for s in FINAL]))
                .order_by(jobs.c.last_seq.desc())
                .limit(MAX_TRACKED_JOBS)
            )
            started = await conn.execute(
                select(job_events.c.job_id, job_events.c.data["placement"])
                .join(jobs, jobs.c.id == job_events.c.job_id)
                .where(*mine, jobs.c.state == "RUNNING")
                .where(job_events.c.type == "job.started")
                .order_by(job_events.c.job_id, job_events.c.seq.desc())
                .ext(distinct_on(job_events.c.job_id))
            )
            open_sessions = await conn.execute(
                select(sessions.c.id, sessions.c.site, sessions.c.hostname, sessions.c.nodes)
                .where(sessions.c.site.in_(own), sessions.c.state == "open")
                .order_by(sessions.c.opened_at)
            )
            failures = await conn.execute(
                select(
                    jobs.c.id,
                    jobs.c.site,
                    jobs.c.app,
                    jobs.c.state,
                    jobs.c.last_error,
                    jobs.c.last_seq,
                )
                .where(*mine, jobs.c.state.in_(FAILURES))
                .order_by(jobs.c.last_seq.desc())
                .limit(RECENT_FAILURES)
            )
            return {
                "position": position,
                "sites": names,
                "counts": _counts(counts.all()),
                "jobs": {str(r.id): [r.site, r.state] for r in unfinished},
                "jobs_truncated": unfinished.rowcount >= MAX_TRACKED_JOBS,
                "running_cores": {str(r[0]): cores_of(r[1]) for r in started},
                "sessions": [_session(r) for r in open_sessions],
                "failures": [_failure(r) for r in failures],
                "targets": TARGETS,
                "final": sorted(s.value for s in FINAL),
            }


def _session(row: Any) -> dict[str, Any]:
    cores = sum(int(node.get("cores", 0)) for node in row.nodes)
    return {"id": str(row.id), "site": row.site, "hostname": row.hostname, "cores": cores}


def _failure(row: Any) -> dict[str, Any]:
    return {
        "job_id": str(row.id),
        "site": row.site,
        "app": row.app,
        "state": row.state,
        "cause": row.last_error or "",
        "seq": row.last_seq,
    }


def _counts(rows: Sequence[Any]) -> dict[str, dict[str, int]]:
    by_site: dict[str, dict[str, int]] = {}
    for site, state, count in rows:
        by_site.setdefault(site, {})[state] = int(count)
    return by_site
