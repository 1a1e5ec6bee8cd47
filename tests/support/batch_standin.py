"""A stand-in for the site's batch module in tests of the elastic queue.

The site agent's batch module (``sched-<site>``: submit what was requested, report what the
scheduler says) is not what these tests are about. This does its part in the smallest way:
it finds requested and deletion-requested batch jobs in the read model, submits them to (or
deletes them from) a :class:`FakeScheduler`, and appends what happened on the site's own key,
as the module would.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
from pydantic import BaseModel

from lodestream.eventlog import EventLog
from lodestream.platform_adapters.schedulers import FakeScheduler
from lodestream.schemas.envelope import Event
from lodestream.schemas.events import (
    BatchJobFinished,
    BatchJobQueued,
    BatchJobRunning,
    BatchJobSubmitted,
)
from lodestream.schemas.events.batch import BatchFinishedData, BatchSubmittedData


class BatchStandIn:
    def __init__(self, log: EventLog, dsn: str, site: str, scheduler: FakeScheduler, tmp: Path):
        self._log = log
        self._dsn = dsn
        self._site = site
        self.scheduler = scheduler
        self._script = tmp / "pilot.sh"
        self._script.write_text("#!/bin/bash\n")
        self.scheduler_ids: dict[uuid.UUID, str] = {}

    async def sync(self) -> None:
        """Submit every requested batch job; delete every one whose deletion was requested."""
        async with await psycopg.AsyncConnection.connect(self._dsn) as conn:
            cursor = await conn.execute(
                "SELECT id, state, num_nodes, wall_time_min, queue, project FROM rm.batch_jobs "
                "WHERE site = %s AND state IN ('requested', 'deletion_requested') ORDER BY id",
                (self._site,),
            )
            rows = await cursor.fetchall()
        for batch_id, state, nodes, wall, queue, project in rows:
            if state == "requested":
                scheduler_id = self.scheduler.submit(
                    self._script, nodes=nodes, wall_time_min=wall, queue=queue, project=project
                )
                self.scheduler_ids[batch_id] = scheduler_id
                await self._append(BatchJobSubmitted, batch_id, BatchSubmittedData(
                    scheduler_id=scheduler_id))  # fmt: skip
                await self._append(BatchJobQueued, batch_id)
            else:
                self.scheduler.delete(self.scheduler_ids[batch_id])
                await self._append(BatchJobFinished, batch_id, BatchFinishedData(
                    state="cancelled", reason="deleted"))  # fmt: skip

    async def start(self, batch_id: uuid.UUID) -> None:
        self.scheduler.start(self.scheduler_ids[batch_id])
        await self._append(BatchJobRunning, batch_id)

    async def _append(
        self, cls: type[Event], batch_id: uuid.UUID, data: BaseModel | None = None
    ) -> None:
        event = cls.create(site=self._site, aggregate_id=batch_id, actor=f"site:{self._site}",
                           data=data)  # fmt: skip
        await self._log.append(event, expect=None)
