"""What the controller reads from the read models, after waiting for the projector.

The controller acts on an event only once the read model reflects at least
that event (``wait_for``), so the states it reads are never older than the
fact it reacts to. Anything newer makes its compare-and-set append fail,
which is the correct outcome.
"""

from __future__ import annotations

import uuid
from typing import Any, Final

from psycopg import AsyncConnection
from sqlalchemy import Float, Integer, any_, bindparam, cast, func, literal_column, select

from lodestream.infra.postgres.compiled import Compiled
from lodestream.infra.postgres.tables import (
    apps,
    batch_jobs,
    job_events,
    jobs,
    scalers,
    sessions,
    sites,
    transfer_items,
)
from lodestream.schemas.batch import batch_cause
from lodestream.schemas.resources import App, JobSpec, TransferState
from lodestream.schemas.states import RUNNABLE, JobState
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.services.controller.decide import LeasedJob
from lodestream.services.controller.errors import ReadModelLag
from lodestream.services.controller.scaler import OPEN_BATCH_STATES, BacklogRow, BatchRow
from lodestream.services.controller.staging import StepItem, StepView
from lodestream.services.projector.errors import ProjectorBehind
from lodestream.services.projector.position import applied_seq, wait_until_applied

_SPEC_COLUMNS: Final = (
    jobs.c.site, jobs.c.app, jobs.c.workdir, jobs.c.parameters, jobs.c.tags, jobs.c.data,
    jobs.c.resources, jobs.c.transfers, jobs.c.parent_ids,
)  # fmt: skip

# Each as the hand-written SQL was, column for column, so the plans are the same.
_STATES: Final = Compiled.of(
    select(jobs.c.id, jobs.c.state).where(jobs.c.id == any_(bindparam("ids")))
)
_SPEC: Final = Compiled.of(
    select(*_SPEC_COLUMNS).where(jobs.c.id == bindparam("id"), jobs.c.site == bindparam("site"))
)
_WAITING_CHILDREN: Final = Compiled.of(
    select(jobs.c.id, jobs.c.last_seq, *_SPEC_COLUMNS).where(
        jobs.c.parent_ids.contains(bindparam("parents")), jobs.c.state == bindparam("state")
    )
)
_HELD_BY: Final = Compiled.of(
    select(jobs.c.id, jobs.c.state, jobs.c.last_seq, jobs.c.attempts, *_SPEC_COLUMNS).where(
        jobs.c.site == bindparam("site"),
        jobs.c.lease_session == bindparam("session"),
        jobs.c.state == any_(bindparam("states")),
    )
)
# The batch job a session ran in, at the session's own site: no other site's rows are read.
_SESSION_BATCH: Final = Compiled.of(
    select(
        batch_jobs.c.id, batch_jobs.c.scheduler, batch_jobs.c.scheduler_id, batch_jobs.c.state,
        batch_jobs.c.scheduler_state,
    )
    .select_from(sessions.join(batch_jobs, batch_jobs.c.id == sessions.c.batch_job_id))
    .where(
        sessions.c.id == bindparam("session"), sessions.c.site == bindparam("site"),
        batch_jobs.c.site == bindparam("site"),
    )
)  # fmt: skip
# A session's newest event and whether it ended by one (closed_at is set by session.closed
# and session.expired; an expiry marker folded from HB sets only the state).
_SESSION_END: Final = Compiled.of(
    select(sessions.c.last_seq, sessions.c.closed_at.is_not(None)).where(
        sessions.c.id == bindparam("session"), sessions.c.site == bindparam("site")
    )
)
_APPLIED: Final = Compiled.of(
    select(job_events.c.seq).where(job_events.c.seq == any_(bindparam("seqs")))
)
_AWAITED_PARENTS: Final = Compiled.of(
    select(func.unnest(jobs.c.parent_ids))
    .distinct()
    .where(
        jobs.c.state == any_(bindparam("states")),
        func.cardinality(jobs.c.parent_ids) > literal_column("0"),
    )
)
_LIVE_SITES: Final = Compiled.of(
    select(sites.c.name, sites.c.owner).where(sites.c.removed_at.is_(None))
)
_APPS: Final = Compiled.of(
    select(
        apps.c.site, apps.c.name, apps.c.description, apps.c.parameters, apps.c.transfers,
        apps.c.python, apps.c.hooks,
    )
)  # fmt: skip

_SCALERS: Final = Compiled.of(
    select(scalers.c.site, scalers.c.backlog)
    .join(sites, sites.c.name == scalers.c.site)
    .where(sites.c.removed_at.is_(None))
)
# The backlog: one aggregate over the runnable rows of the elastic sites (index jobs_site_state).
_NODES: Final = cast(jobs.c.resources["num_nodes"].astext, Float) / cast(
    jobs.c.resources["node_packing_count"].astext, Float
)
_WALL: Final = cast(jobs.c.resources["wall_time_min"].astext, Integer)
_BACKLOG: Final = Compiled.of(
    select(jobs.c.site, func.count(), func.sum(_NODES), func.sum(_NODES * _WALL), func.max(_WALL))
    .where(
        jobs.c.site == any_(bindparam("sites")),
        jobs.c.state == any_(bindparam("states")),
        jobs.c.lease_session.is_(None),
    )
    .group_by(jobs.c.site)
)
_OPEN_BATCH_JOBS: Final = Compiled.of(
    select(
        batch_jobs.c.site, batch_jobs.c.id, batch_jobs.c.state, batch_jobs.c.num_nodes,
        batch_jobs.c.wall_time_min, batch_jobs.c.queue, batch_jobs.c.created_at,
        batch_jobs.c.requested_by,
    )
    .where(batch_jobs.c.site == any_(bindparam("sites")),
           batch_jobs.c.state == any_(bindparam("states")))
    .order_by(batch_jobs.c.site, batch_jobs.c.created_at.desc(), batch_jobs.c.id)
)  # fmt: skip

# A transfer item's step, then the step's items and its job: all at the item's own site.
_ITEM_STEP: Final = Compiled.of(
    select(transfer_items.c.job_id, transfer_items.c.step_id, transfer_items.c.direction).where(
        transfer_items.c.id == bindparam("id"), transfer_items.c.site == bindparam("site")
    )
)
_STEP: Final = Compiled.of(
    select(
        transfer_items.c.slot, transfer_items.c.state, transfer_items.c.reason, jobs.c.state,
        jobs.c.last_seq,
    )
    .select_from(transfer_items.join(jobs, jobs.c.id == transfer_items.c.job_id))
    .where(
        transfer_items.c.step_id == bindparam("step"), transfer_items.c.site == bindparam("site"),
        jobs.c.site == bindparam("site"),
    )
)  # fmt: skip


def spec_from_row(row: tuple[Any, ...]) -> JobSpec:
    site, app, workdir, parameters, tags, data, resources, transfers, parent_ids = row
    return JobSpec.model_validate(
        {
            "site": site, "app": app, "workdir": workdir, "parameters": parameters,
            "tags": tags, "data": data, "transfers": transfers, "parent_ids": parent_ids,
            **resources,
        }
    )  # fmt: skip


class ReadModel:
    def __init__(self, dsn: str, *, poll_s: float = 0.005) -> None:
        self._dsn = dsn
        self._poll_s = poll_s
        self._conn: AsyncConnection[Any] | None = None

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def _c(self) -> AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = await AsyncConnection.connect(self._dsn, autocommit=True)
        return self._conn

    async def position(self) -> int:
        return await applied_seq(await self._c(), EVENTS_STREAM)

    async def wait_for(self, seq: int, timeout_s: float = 30.0) -> None:
        try:
            await wait_until_applied(self.position, seq, timeout_s=timeout_s, poll_s=self._poll_s)
        except ProjectorBehind as exc:
            raise ReadModelLag(f"projector did not reach sequence {seq} in {timeout_s}s") from exc

    async def states(self, ids: list[uuid.UUID]) -> dict[uuid.UUID, JobState]:
        if not ids:
            return {}
        conn = await self._c()
        cursor = await conn.execute(_STATES.sql, _STATES.params(ids=ids))
        return {job_id: JobState(state) for job_id, state in await cursor.fetchall()}

    async def spec(self, site: str, job_id: uuid.UUID) -> JobSpec | None:
        """The spec of job ``job_id`` at ``site``; None if that site has no such job."""
        conn = await self._c()
        cursor = await conn.execute(_SPEC.sql, _SPEC.params(id=job_id, site=site))
        row = await cursor.fetchone()
        return spec_from_row(row) if row else None

    async def step(self, site: str, item: uuid.UUID) -> StepView | None:
        """The staging step transfer item ``item`` of ``site`` belongs to (None: no such item)."""
        conn = await self._c()
        cursor = await conn.execute(_ITEM_STEP.sql, _ITEM_STEP.params(id=item, site=site))
        found = await cursor.fetchone()
        if found is None or found[1] is None:
            return None
        job_id, step_id, direction = found
        cursor = await conn.execute(_STEP.sql, _STEP.params(step=step_id, site=site))
        rows = await cursor.fetchall()
        if not rows:
            return None
        return StepView(
            job_id=job_id, site=site, step_id=step_id, direction=direction,
            job_state=JobState(rows[0][3]), job_seq=int(rows[0][4]),
            items=[StepItem(slot, TransferState(state), reason or "")
                   for slot, state, reason, _, _ in rows],
        )  # fmt: skip

    async def waiting_children(self, parent: uuid.UUID) -> list[tuple[uuid.UUID, int, JobSpec]]:
        conn = await self._c()
        cursor = await conn.execute(
            _WAITING_CHILDREN.sql,
            _WAITING_CHILDREN.params(parents=[parent], state=JobState.AWAITING_PARENTS.value),
        )
        return [(r[0], int(r[1]), spec_from_row(r[2:])) for r in await cursor.fetchall()]

    async def held_by(self, site: str, session_id: uuid.UUID) -> list[LeasedJob]:
        conn = await self._c()
        states = [s.value for s in (*RUNNABLE, JobState.RUNNING)]
        cursor = await conn.execute(
            _HELD_BY.sql, _HELD_BY.params(site=site, session=session_id, states=states)
        )
        return [
            LeasedJob(r[0], JobState(r[1]), int(r[2]), max(int(r[3]), 1), spec_from_row(r[4:]))
            for r in await cursor.fetchall()
        ]

    async def session_batch(self, site: str, session_id: uuid.UUID) -> str | None:
        """The batch-job link of the cause chain of what the session held, if it ran in one:
        ``batch job <id> (slurm 1234): walltime_expired`` once the job ended, else its state."""
        conn = await self._c()
        cursor = await conn.execute(
            _SESSION_BATCH.sql, _SESSION_BATCH.params(session=session_id, site=site)
        )
        row = await cursor.fetchone()
        if row is None:
            return None
        batch_id, scheduler, scheduler_id, state, scheduler_state = row
        return batch_cause(batch_id, scheduler=scheduler or "", scheduler_id=scheduler_id,
                           verdict=scheduler_state or state)  # fmt: skip

    async def session_seq(self, site: str, session_id: uuid.UUID) -> int | None:
        """The sequence of the session's newest event, 0 if it never opened, None if it ended
        (see ``decide.on_session_expired``)."""
        conn = await self._c()
        cursor = await conn.execute(
            _SESSION_END.sql, _SESSION_END.params(session=session_id, site=site)
        )
        row = await cursor.fetchone()
        if row is None:
            return 0
        last_seq, ended = row
        return None if ended else int(last_seq)

    async def applied(self, seqs: list[int]) -> set[int]:
        """Which of ``seqs`` the projector folded as job events (the rest it quarantined)."""
        conn = await self._c()
        cursor = await conn.execute(_APPLIED.sql, _APPLIED.params(seqs=seqs))
        return {int(row[0]) for row in await cursor.fetchall()}

    async def awaited_parents(self) -> set[uuid.UUID]:
        """Ids of the jobs that some job not yet released still waits on."""
        conn = await self._c()
        states = [JobState.CREATED.value, JobState.AWAITING_PARENTS.value]
        cursor = await conn.execute(_AWAITED_PARENTS.sql, _AWAITED_PARENTS.params(states=states))
        return {row[0] for row in await cursor.fetchall()}

    async def live_sites(self) -> dict[str, str]:
        """The live sites and their owners."""
        conn = await self._c()
        cursor = await conn.execute(_LIVE_SITES.sql, _LIVE_SITES.params())
        return {str(r[0]): str(r[1]) for r in await cursor.fetchall()}

    async def apps(self) -> dict[tuple[str, str], App]:
        conn = await self._c()
        cursor = await conn.execute(_APPS.sql, _APPS.params())
        return {
            (r[0], r[1]): App(site=r[0], name=r[1], description=r[2], parameters=r[3],
                              transfers=r[4], python=r[5], hooks=tuple(r[6]))
            for r in await cursor.fetchall()
        }  # fmt: skip

    # --- the elastic queues' backlog ------------------------------------------------------

    async def scalers(self) -> dict[str, Any]:
        """The live sites whose elastic queue has spoken, and the backlog they last got."""
        conn = await self._c()
        cursor = await conn.execute(_SCALERS.sql, _SCALERS.params())
        return {str(r[0]): r[1] for r in await cursor.fetchall()}

    async def backlogs(self, sites: list[str]) -> dict[str, BacklogRow]:
        conn = await self._c()
        states = [s.value for s in RUNNABLE]
        cursor = await conn.execute(_BACKLOG.sql, _BACKLOG.params(sites=sites, states=states))
        return {
            str(r[0]): BacklogRow(int(r[1]), float(r[2] or 0), float(r[3] or 0), int(r[4] or 0))
            for r in await cursor.fetchall()
        }

    async def open_batch_jobs(self, sites: list[str]) -> dict[str, list[BatchRow]]:
        """Each site's batch jobs that have not ended, newest first."""
        conn = await self._c()
        cursor = await conn.execute(
            _OPEN_BATCH_JOBS.sql,
            _OPEN_BATCH_JOBS.params(sites=sites, states=list(OPEN_BATCH_STATES)),
        )
        found: dict[str, list[BatchRow]] = {}
        for site, *row in await cursor.fetchall():
            found.setdefault(str(site), []).append(BatchRow(*row))
        return found
