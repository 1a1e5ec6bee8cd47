"""``lode projector rebuild``: replay the log from sequence 1 into fresh tables, then swap.

1. Create schema ``rm_rebuild`` with exactly the live tables (same metadata,
   schema translated), so index and constraint names match the migrations.
2. Replay EVENTS then HB from sequence 1 with an ephemeral no-ack consumer
   (EVENTS read as bytes, see reading.py), holding every job in memory so
   each job row is written once; then build the indexes other than the keys,
   once, over the loaded rows.
3. Lock the live projector's position rows (the live projector waits),
   replay what arrived meanwhile, and in the same transaction rename
   ``rm`` away, ``rm_rebuild`` to ``rm`` and drop the old schema.

Readers see the old tables until the commit and the new ones after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from psycopg import AsyncConnection, sql
from sqlalchemy import create_engine
from sqlalchemy.schema import CreateIndex, CreateTable

from lodestream.collector import collector_paused
from lodestream.infra.postgres.tables import (
    READ_MODEL_TABLES,
    READ_SCHEMA,
    REBUILD_SCHEMA,
    metadata,
)
from lodestream.schemas.subjects import EVENTS_STREAM, HB_STREAM
from lodestream.services.projector.ahead import decode_sliced, fold_into
from lodestream.services.projector.errors import RebuildError
from lodestream.services.projector.messages import RawMessage
from lodestream.services.projector.projection import Changes, Known, Projection
from lodestream.services.projector.reading import stream_reader
from lodestream.services.projector.store import ProjectionStore, Rows

log = logging.getLogger(__name__)
STREAMS = (EVENTS_STREAM, HB_STREAM)


@dataclass(frozen=True, slots=True)
class RebuildReport:
    events: int
    jobs: int
    quarantined: int
    seconds: float
    positions: dict[str, int]

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


def sqlalchemy_url(dsn: str) -> str:
    return dsn.replace("postgresql://", "postgresql+psycopg://", 1)


def create_rebuild_schema(dsn: str) -> None:
    """Schema ``rm_rebuild`` with the live tables and their keys, not yet their other indexes.

    The bulk replay needs only the keys (its upserts and updates go by them); building each
    other index once over the loaded rows (:func:`index_rebuild_schema`) is far cheaper than
    maintaining it row by row, the GIN indexes on a million jobs above all.
    """
    engine = create_engine(sqlalchemy_url(dsn))
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {REBUILD_SCHEMA} CASCADE")
            conn.exec_driver_sql(f"CREATE SCHEMA {REBUILD_SCHEMA}")
            translated = conn.execution_options(schema_translate_map={READ_SCHEMA: REBUILD_SCHEMA})
            for table in metadata.sorted_tables:  # referenced tables first
                if table in READ_MODEL_TABLES:
                    translated.execute(CreateTable(table))
    finally:
        engine.dispose()


def index_rebuild_schema(dsn: str) -> None:
    """Create the indexes :func:`create_rebuild_schema` left out (same metadata, same names)."""
    engine = create_engine(sqlalchemy_url(dsn))
    try:
        with engine.begin() as conn:
            # Room to sort a million jobs' keys in memory, for this transaction only.
            conn.exec_driver_sql("SET LOCAL maintenance_work_mem = '256MB'")
            translated = conn.execution_options(schema_translate_map={READ_SCHEMA: REBUILD_SCHEMA})
            for table in READ_MODEL_TABLES:
                for index in sorted(table.indexes, key=lambda i: str(i.name)):
                    translated.execute(CreateIndex(index))
    finally:
        engine.dispose()


async def read_stream(
    js: JetStreamContext, stream: str, first: int, last: int, batch: int
) -> AsyncIterator[list[RawMessage]]:
    """Yield batches of ``stream`` messages with ``first <= seq <= last``."""
    if last < first:
        return
    name = f"rebuild-{uuid.uuid4().hex[:12]}"
    await js.add_consumer(
        stream,
        ConsumerConfig(
            name=name,
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=first,
            inactive_threshold=30.0,
            max_waiting=2,  # the EVENTS reader asks for the next batch while one is folded
        ),
    )
    reader = stream_reader(js, stream, name)
    await reader.start()
    try:
        seen = first - 1
        while seen < last:
            fetched = await reader.fetch(batch, timeout=2.0)
            if fetched and not any(r.seq <= last for r in fetched):
                return  # past the end we were asked for
            raws = [r for r in fetched if r.seq <= last]
            if raws:
                seen = raws[-1].seq
                yield raws
            elif (await js.consumer_info(stream, name)).num_pending == 0:
                # Nothing left to deliver although ``last`` was not reached: the rest aged
                # out (HB keeps heartbeats and markers only so long), so there is no more.
                return
    finally:
        await reader.stop()
        with contextlib.suppress(NotFoundError):
            await js.delete_consumer(stream, name)


class Rebuild:
    def __init__(self, js: JetStreamContext, dsn: str, *, batch_size: int = 5000) -> None:
        self._js = js
        self._dsn = dsn
        self._batch = batch_size
        self._store = ProjectionStore(REBUILD_SCHEMA)
        self._known = Known()
        self._events = 0
        self._quarantined = 0

    async def run(self) -> RebuildReport:
        # Every job is held in memory until its one write, and a full collection would walk
        # all of them again every few batches; the replay makes no reference cycles.
        with collector_paused():
            return await self._run()

    async def _run(self) -> RebuildReport:
        started = time.perf_counter()
        create_rebuild_schema(self._dsn)
        positions = dict.fromkeys(STREAMS, 0)
        conn = await AsyncConnection.connect(self._dsn)
        try:
            await self._store.prepare(conn)
            # Phase 1: bulk replay, every job kept in memory and written once at the end.
            bulk = Changes()
            for stream in STREAMS:
                last = await self._last_seq(stream)
                positions[stream] = await self._replay(conn, stream, 1, last, bulk, keep_jobs=True)
            async with conn.transaction():
                await self._store.write_jobs(conn, Changes(new_jobs=bulk.new_jobs))
            await asyncio.to_thread(index_rebuild_schema, self._dsn)
            # Phase 2: stop the live projector at a batch boundary, catch up, swap.
            async with conn.transaction():
                live = ProjectionStore(READ_SCHEMA)
                for stream in STREAMS:
                    await live.lock_position(conn, stream)
                for stream in STREAMS:
                    last = await self._last_seq(stream)
                    positions[stream] = await self._replay(
                        conn, stream, positions[stream] + 1, last, Changes(), keep_jobs=False
                    )
                for stream, seq in positions.items():
                    await conn.execute(
                        sql.SQL(
                            "INSERT INTO {s}.projector_position (stream, seq, updated_at) "
                            "VALUES (%s, %s, now()) ON CONFLICT (stream) DO UPDATE "
                            "SET seq = EXCLUDED.seq, updated_at = now()"
                        ).format(s=sql.Identifier(REBUILD_SCHEMA)),
                        (stream, seq),
                    )
                await conn.execute(f"ALTER SCHEMA {READ_SCHEMA} RENAME TO rm_retired")
                await conn.execute(f"ALTER SCHEMA {REBUILD_SCHEMA} RENAME TO {READ_SCHEMA}")
                await conn.execute("DROP SCHEMA rm_retired CASCADE")
        except Exception as exc:
            raise RebuildError(f"rebuild failed, live tables untouched: {exc}") from exc
        finally:
            await conn.close()
        return RebuildReport(
            events=self._events,
            jobs=len(self._known.jobs),
            quarantined=self._quarantined,
            seconds=time.perf_counter() - started,
            positions=positions,
        )

    async def _write(self, conn: AsyncConnection[Any], rows: Rows) -> None:
        async with conn.transaction():
            await self._store.write(conn, rows)

    async def _last_seq(self, stream: str) -> int:
        info = await self._js.stream_info(stream)
        return int(info.state.last_seq)

    async def _replay(
        self,
        conn: AsyncConnection[Any],
        stream: str,
        first: int,
        last: int,
        changes: Changes,
        *,
        keep_jobs: bool,
    ) -> int:
        """Fold ``first..last`` of ``stream``; return the last sequence folded.

        Each batch is written while the next is folded (in slices, as the live projector
        folds ahead: ahead.py), one transaction in flight. Its rows are taken before the
        next fold starts, which moves the same job objects on.
        """
        position = first - 1
        projection = Projection(self._known, changes)
        writing: asyncio.Task[None] | None = None
        try:
            async for raws in read_stream(self._js, stream, first, last, self._batch):
                decoded = await decode_sliced(raws)
                await fold_into(projection, list(zip(raws, decoded, strict=True)))
                position = raws[-1].seq
                self._events += len(raws)
                self._quarantined += len(changes.quarantine)
                # Flush what does not need the final job rows; keep jobs for one write at
                # the end.
                flush = Changes(
                    job_events=changes.job_events, ops=changes.ops, quarantine=changes.quarantine
                )
                if not keep_jobs:
                    flush.new_jobs, flush.updated_jobs = changes.new_jobs, changes.updated_jobs
                rows = Rows.taken(flush)
                changes.job_events, changes.ops, changes.quarantine = [], [], []
                if not keep_jobs:
                    changes.new_jobs, changes.updated_jobs = {}, {}
                if writing is not None:
                    await writing
                writing = asyncio.create_task(self._write(conn, rows))
            if writing is not None:
                await writing
        finally:
            if writing is not None and not writing.done():
                writing.cancel()
                with contextlib.suppress(BaseException):
                    await writing
        log.info("rebuild: %s replayed up to %d", stream, position)
        return position
