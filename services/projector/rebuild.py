"""``lode projector rebuild``: replay the log from sequence 1 into fresh tables, then swap.

1. Create schema ``rm_rebuild`` with exactly the live tables (same metadata,
   schema translated), so index and constraint names match the migrations.
2. Replay EVENTS then HB from sequence 1 with an ephemeral no-ack consumer
   (EVENTS read as bytes, see reading.py), holding every job in memory so
   each job row is written once (bulk.py); then build the indexes other than
   the keys, once, over the loaded rows. A long EVENTS is folded by several
   processes, each job's events by one of them (split.py).
3. Lock the live projector's position rows (the live projector waits),
   replay what arrived meanwhile onto the rebuilt tables, as the live
   projector folds (each batch onto the rows it names, read back), and in the
   same transaction rename ``rm`` away, ``rm_rebuild`` to ``rm`` and drop the
   old schema.

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
from lodestream.eventlog.rawpull import RawPull, Wire
from lodestream.infra.postgres.tables import (
    READ_MODEL_TABLES,
    READ_SCHEMA,
    REBUILD_SCHEMA,
    metadata,
)
from lodestream.schemas.subjects import EVENTS_STREAM, HB_STREAM
from lodestream.services.projector.ahead import decode_sliced, fold_into
from lodestream.services.projector.bulk import BulkFold, raws_of
from lodestream.services.projector.errors import RebuildError
from lodestream.services.projector.messages import RawMessage
from lodestream.services.projector.projection import Changes, Projection, ids_to_load
from lodestream.services.projector.reading import stream_reader
from lodestream.services.projector.split import (
    ShareDone,
    ShareTask,
    deal,
    shares_for,
)
from lodestream.services.projector.store import ProjectionStore, Rows
from lodestream.shares import default_workers, send_all

log = logging.getLogger(__name__)
STREAMS = (EVENTS_STREAM, HB_STREAM)
FETCH_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class RebuildReport:
    workers: int  # the processes that folded EVENTS (1: the rebuilding process alone)
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


@contextlib.asynccontextmanager
async def ephemeral_consumer(
    js: JetStreamContext, stream: str, first: int
) -> AsyncIterator[tuple[str, int]]:
    """A no-ack consumer of ``stream`` from sequence ``first``: its name, and how many
    messages it holds; deleted on the way out."""
    name = f"rebuild-{uuid.uuid4().hex[:12]}"
    info = await js.add_consumer(
        stream,
        ConsumerConfig(
            name=name,
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=first,
            inactive_threshold=30.0,
            max_waiting=2,  # the reader asks for the next batch while one is folded
        ),
    )
    try:
        yield name, info.num_pending or 0
    finally:
        with contextlib.suppress(NotFoundError):
            await js.delete_consumer(stream, name)


async def read_stream(
    js: JetStreamContext, stream: str, first: int, last: int, batch: int
) -> AsyncIterator[list[RawMessage]]:
    """Yield batches of ``stream`` messages with ``first <= seq <= last``."""
    if last < first:
        return
    async with ephemeral_consumer(js, stream, first) as (name, _):
        reader = stream_reader(js, stream, name)
        await reader.start()
        try:
            seen = first - 1
            while seen < last:
                fetched = await reader.fetch(batch, timeout=FETCH_TIMEOUT_S)
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


async def read_wires(js: JetStreamContext, last: int, batch: int) -> AsyncIterator[list[Wire]]:
    """``EVENTS`` from sequence 1 to ``last`` as the wire gave the messages, nothing of them
    parsed (the last batch may hold some past ``last``: :func:`raws_of` drops them)."""
    if last < 1:
        return
    async with ephemeral_consumer(js, EVENTS_STREAM, 1) as (name, held):
        pull = await RawPull.on(js, EVENTS_STREAM, name).start()

        async def pending_now() -> int:
            return int((await js.consumer_info(EVENTS_STREAM, name)).num_pending or 0)

        try:
            async for wires in pull.wires_until(
                last, held, batch=batch, fetch_timeout_s=FETCH_TIMEOUT_S, pending_now=pending_now
            ):
                yield wires
        finally:
            await pull.stop()


class Rebuild:
    """``workers``: how many processes fold ``EVENTS`` (1: this one alone); None chooses
    by the machine's cores and the log's length (:func:`lodestream.shares.default_workers`)."""

    def __init__(
        self, js: JetStreamContext, dsn: str, *, batch_size: int = 5000, workers: int | None = None
    ) -> None:
        if workers is not None and workers < 1:
            raise ValueError(f"a rebuild needs at least one worker, got {workers}")
        self._js = js
        self._dsn = dsn
        self._batch = batch_size
        self._workers = workers
        self._store = ProjectionStore(REBUILD_SCHEMA)
        self._used = 1
        self._events = 0
        self._jobs = 0
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
        own = BulkFold(self._store)
        try:
            await self._store.prepare(conn)
            # Phase 1: bulk replay, every job kept in memory and written once at the end.
            positions[EVENTS_STREAM] = await self._last_seq(EVENTS_STREAM)
            shares = await self._replay_events(conn, own, positions[EVENTS_STREAM])
            log.info("rebuild: %s replayed up to %d", EVENTS_STREAM, positions[EVENTS_STREAM])
            positions[HB_STREAM] = await self._last_seq(HB_STREAM)
            async for raws in read_stream(
                self._js, HB_STREAM, 1, positions[HB_STREAM], self._batch
            ):
                await own.take(conn, raws)
            log.info("rebuild: %s replayed up to %d", HB_STREAM, positions[HB_STREAM])
            await own.finish(conn)
            parts: list[BulkFold | ShareDone] = [own, *shares]
            for part in parts:
                self._events += part.events
                self._jobs += part.jobs
                self._quarantined += part.quarantined
            await asyncio.to_thread(index_rebuild_schema, self._dsn)
            log.info("rebuild: indexes built")
            # Phase 2: stop the live projector at a batch boundary, catch up, swap.
            async with conn.transaction():
                live = ProjectionStore(READ_SCHEMA)
                for stream in STREAMS:
                    await live.lock_position(conn, stream)
                for stream in STREAMS:
                    last = await self._last_seq(stream)
                    positions[stream] = await self._catch_up(
                        conn, stream, positions[stream] + 1, last, positions[stream]
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
            await own.abandon()
            await conn.close()
        return RebuildReport(
            workers=self._used,
            events=self._events,
            jobs=self._jobs,
            quarantined=self._quarantined,
            seconds=time.perf_counter() - started,
            positions=positions,
        )

    async def _last_seq(self, stream: str) -> int:
        info = await self._js.stream_info(stream)
        return int(info.state.last_seq)

    async def _replay_events(
        self, conn: AsyncConnection[Any], own: BulkFold, last: int
    ) -> list[ShareDone]:
        """Fold ``EVENTS`` up to ``last``: here, or split across processes by job (each
        writes its jobs before it reports); return what those processes folded."""
        count = self._workers if self._workers is not None else default_workers(last)
        self._used = count
        if count == 1:
            async for wires in read_wires(self._js, last, self._batch):
                await own.take(conn, raws_of(wires, last))
            return []
        pool = shares_for([ShareTask(self._dsn, last, share, count) for share in range(count)])
        try:
            pool.start()
            async for wires in read_wires(self._js, last, self._batch):
                kept, dealt = deal(wires, count)
                sending = asyncio.ensure_future(send_all(pool, dealt))
                try:
                    await own.take(conn, raws_of(kept, last))
                finally:
                    await sending
            await asyncio.to_thread(pool.finish)
            done: list[ShareDone] = await asyncio.to_thread(pool.collect)
        finally:
            await asyncio.to_thread(pool.stop)
        return done

    async def _catch_up(
        self, conn: AsyncConnection[Any], stream: str, first: int, last: int, position: int
    ) -> int:
        """Fold ``first..last`` of ``stream`` onto the rebuilt tables, each batch onto the rows
        it names (read back, as the live projector reads what it does not hold); return the
        last sequence folded (``position`` if none)."""
        async for raws in read_stream(self._js, stream, first, last, self._batch):
            decoded = await decode_sliced(raws)
            known = await self._store.load_known(conn, *ids_to_load(decoded))
            changes = Changes()
            await fold_into(Projection(known, changes), list(zip(raws, decoded, strict=True)))
            await self._store.write(conn, Rows.of(changes))
            self._events += len(raws)
            self._jobs += len(changes.new_jobs)
            self._quarantined += len(changes.quarantine)
            position = raws[-1].seq
        log.info("rebuild: %s caught up to %d", stream, position)
        return position
