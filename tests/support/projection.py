"""Helpers to drive a real projector and read the read models back."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
from nats.js import JetStreamContext

from lodestream.infra.postgres.tables import READ_SCHEMA
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.services.projector.consumer import Projector
from lodestream.services.projector.position import applied_seq, wait_until_applied
from lodestream.services.projector.store import ProjectionStore
from tests.support.running import running_until_stopped

# Row order and columns that define "the same read model" for rebuild and crash tests.
TABLE_ORDER = {
    "jobs": "id",
    "job_events": "seq",
    "sites": "name",
    "apps": "site, name",
    "batch_jobs": "id",
    "scalers": "site",
    "scaler_decisions": "seq",
    "sessions": "id",
    "transfer_items": "id",
    "quarantine": "stream, seq",
}


async def position(dsn: str, stream: str = EVENTS_STREAM) -> int:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        return await applied_seq(conn, stream)


async def wait_for_position(dsn: str, seq: int, timeout_s: float = 60.0) -> None:
    """Until the projector has applied ``seq``; ProjectorBehind (a TimeoutError) after that."""
    await wait_until_applied(lambda: position(dsn), seq, timeout_s=timeout_s, poll_s=0.05)


@asynccontextmanager
async def running_projector(
    js: JetStreamContext, dsn: str, *, linger_s: float = 0.0, fetch_timeout_s: float = 0.2
) -> AsyncIterator[Projector]:
    projector = Projector(
        js, dsn, stream=EVENTS_STREAM, durable="projector", batch_size=500,
        fetch_timeout_s=fetch_timeout_s, store=ProjectionStore(READ_SCHEMA), linger_s=linger_s,
    )  # fmt: skip
    async with running_until_stopped(projector.run, stop_timeout_s=10):
        yield projector


async def table_digest(dsn: str) -> dict[str, tuple[int, str]]:
    """Row count and a SHA-256 over every row of every read-model table, in key order."""
    digest: dict[str, tuple[int, str]] = {}
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        for table, order in TABLE_ORDER.items():
            # quarantined_at records when a projector saw the message, not a fact of the log.
            row = "(t.stream, t.seq, t.subject, t.reason, t.raw)" if table == "quarantine" else "t"
            cursor = await conn.execute(
                f"SELECT {row}::text FROM {READ_SCHEMA}.{table} t ORDER BY {order}"
            )
            rows = [r[0] for r in await cursor.fetchall()]
            h = hashlib.sha256("\n".join(rows).encode()).hexdigest()
            digest[table] = (len(rows), h)
    return digest
