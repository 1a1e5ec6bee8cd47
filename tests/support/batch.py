"""Pilot batch jobs in tests: ask for one as the API does, read its row and its events."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import nats.errors
import psycopg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from psycopg.rows import dict_row

from lodestream.eventlog import EventLog
from lodestream.schemas.batch import request_batch_job
from lodestream.schemas.codec import decode
from lodestream.schemas.envelope import Event
from lodestream.schemas.events import BatchJobDeletionRequested
from lodestream.schemas.events.batch import BatchReasonData, BatchRequestData
from lodestream.schemas.subjects import EVENTS_STREAM, aggregate_filter


async def ask_for_pilot(
    js: JetStreamContext, site: str, owner: str, **request: Any
) -> tuple[uuid.UUID, int]:
    """Append ``batch.requested`` as the API does for ``owner``: the batch id and sequence."""
    data = BatchRequestData.model_validate({"num_nodes": 1, "wall_time_min": 5,
                                            "job_mode": "serial", **request})  # fmt: skip
    event = request_batch_job(site, data, actor=f"user:{owner}")
    appended = await EventLog(js).append(event, expect=0)
    return event.aggregate_id, appended.seq


async def ask_to_delete(
    js: JetStreamContext, site: str, owner: str, batch_id: uuid.UUID, expect: int | None = None
) -> int:
    """Append ``batch.deletion_requested`` as the API does (``expect=None``: unchained)."""
    event = BatchJobDeletionRequested.create(
        site=site, aggregate_id=batch_id, actor=f"user:{owner}",
        data=BatchReasonData(reason=f"deleted by {owner}"),
    )  # fmt: skip
    return (await EventLog(js).append(event, expect=expect)).seq


async def batch_row(dsn: str, batch_id: uuid.UUID) -> dict[str, Any] | None:
    async with await psycopg.AsyncConnection.connect(dsn, row_factory=dict_row) as conn:
        cursor = await conn.execute("SELECT * FROM rm.batch_jobs WHERE id = %s", (batch_id,))
        return await cursor.fetchone()


async def until_batch(
    dsn: str, batch_id: uuid.UUID, *states: str, timeout_s: float = 60
) -> dict[str, Any]:
    """The batch job's row once its state is one of ``states``."""
    async with asyncio.timeout(timeout_s):
        while True:
            row = await batch_row(dsn, batch_id)
            if row is not None and row["state"] in states:
                return row
            await asyncio.sleep(0.05)


async def batch_events(js: JetStreamContext, site: str, batch_id: uuid.UUID) -> list[Event]:
    """Every event of the batch job, in log order (an ephemeral consumer of the control plane)."""
    sub = await js.pull_subscribe(
        aggregate_filter(site, "batch", batch_id), stream=EVENTS_STREAM,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE,
                              inactive_threshold=30.0),
    )  # fmt: skip
    events: list[Event] = []
    try:
        while True:
            try:
                msgs = await sub.fetch(100, timeout=0.5)
            except (TimeoutError, nats.errors.TimeoutError):
                return events
            events += [decode(m.data) for m in msgs]
    finally:
        await sub.unsubscribe()


async def batch_types(js: JetStreamContext, site: str, batch_id: uuid.UUID) -> list[str]:
    return [e.type for e in await batch_events(js, site, batch_id)]
