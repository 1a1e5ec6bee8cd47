"""What the controller reads from the read models, after waiting for the projector.

The controller acts on an event only once the read model reflects at least
that event (``wait_for``), so the states it reads are never older than the
fact it reacts to. Anything newer makes its compare-and-set append fail,
which is the correct outcome.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from psycopg import AsyncConnection

from lodestream.schemas.resources import App, JobSpec
from lodestream.schemas.states import RUNNABLE, JobState
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.services.controller.decide import LeasedJob
from lodestream.services.controller.errors import ReadModelLag

_SPEC_COLUMNS = "site, app, workdir, parameters, tags, data, resources, transfers, parent_ids"


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
        conn = await self._c()
        cursor = await conn.execute(
            "SELECT seq FROM rm.projector_position WHERE stream = %s", (EVENTS_STREAM,)
        )
        row = await cursor.fetchone()
        return int(row[0]) if row else 0

    async def wait_for(self, seq: int, timeout_s: float = 30.0) -> None:
        try:
            async with asyncio.timeout(timeout_s):
                # Polling a row is cheaper here than LISTEN/NOTIFY plumbing; 5 ms keeps latency low.
                while await self.position() < seq:  # noqa: ASYNC110
                    await asyncio.sleep(self._poll_s)
        except TimeoutError as exc:
            raise ReadModelLag(f"projector did not reach sequence {seq} in {timeout_s}s") from exc

    async def states(self, ids: list[uuid.UUID]) -> dict[uuid.UUID, JobState]:
        if not ids:
            return {}
        conn = await self._c()
        cursor = await conn.execute("SELECT id, state FROM rm.jobs WHERE id = ANY(%s)", (ids,))
        return {job_id: JobState(state) for job_id, state in await cursor.fetchall()}

    async def spec(self, site: str, job_id: uuid.UUID) -> JobSpec | None:
        """The spec of job ``job_id`` at ``site``; None if that site has no such job."""
        conn = await self._c()
        cursor = await conn.execute(
            f"SELECT {_SPEC_COLUMNS} FROM rm.jobs WHERE id = %s AND site = %s",  # noqa: S608
            (job_id, site),
        )
        row = await cursor.fetchone()
        return spec_from_row(row) if row else None

    async def waiting_children(self, parent: uuid.UUID) -> list[tuple[uuid.UUID, int, JobSpec]]:
        conn = await self._c()
        cursor = await conn.execute(
            f"SELECT id, last_seq, {_SPEC_COLUMNS} FROM rm.jobs "  # noqa: S608
            "WHERE parent_ids @> ARRAY[%s]::uuid[] AND state = %s",
            (parent, JobState.AWAITING_PARENTS.value),
        )
        return [(r[0], int(r[1]), spec_from_row(r[2:])) for r in await cursor.fetchall()]

    async def held_by(self, site: str, session_id: uuid.UUID) -> list[LeasedJob]:
        conn = await self._c()
        states = [s.value for s in (*RUNNABLE, JobState.RUNNING)]
        cursor = await conn.execute(
            f"SELECT id, state, last_seq, attempts, {_SPEC_COLUMNS} FROM rm.jobs "  # noqa: S608
            "WHERE site = %s AND lease_session = %s AND state = ANY(%s)",
            (site, session_id, states),
        )
        return [
            LeasedJob(r[0], JobState(r[1]), int(r[2]), max(int(r[3]), 1), spec_from_row(r[4:]))
            for r in await cursor.fetchall()
        ]

    async def applied(self, seqs: list[int]) -> set[int]:
        """Which of ``seqs`` the projector folded as job events (the rest it quarantined)."""
        conn = await self._c()
        cursor = await conn.execute("SELECT seq FROM rm.job_events WHERE seq = ANY(%s)", (seqs,))
        return {int(row[0]) for row in await cursor.fetchall()}

    async def awaited_parents(self) -> set[uuid.UUID]:
        """Ids of the jobs that some job not yet released still waits on."""
        conn = await self._c()
        cursor = await conn.execute(
            "SELECT DISTINCT unnest(parent_ids) FROM rm.jobs "
            "WHERE state = ANY(%s) AND cardinality(parent_ids) > 0",
            ([JobState.CREATED.value, JobState.AWAITING_PARENTS.value],),
        )
        return {row[0] for row in await cursor.fetchall()}

    async def live_sites(self) -> dict[str, str]:
        """The live sites and their owners."""
        conn = await self._c()
        cursor = await conn.execute("SELECT name, owner FROM rm.sites WHERE removed_at IS NULL")
        return {str(r[0]): str(r[1]) for r in await cursor.fetchall()}

    async def apps(self) -> dict[tuple[str, str], App]:
        conn = await self._c()
        cursor = await conn.execute(
            "SELECT site, name, description, parameters, transfers, python, hooks FROM rm.apps"
        )
        return {
            (r[0], r[1]): App(site=r[0], name=r[1], description=r[2], parameters=r[3],
                              transfers=r[4], python=r[5], hooks=tuple(r[6]))
            for r in await cursor.fetchall()
        }  # fmt: skip
