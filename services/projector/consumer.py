"""The live projector loop: fetch a batch, fold it, commit rows + position, then ack.

The consumer uses AckAll: one ack after the commit covers the whole batch.
If the process dies between commit and ack, the batch is redelivered and
every message at or below the committed position is skipped — applied
exactly once. A Postgres error keeps the batch in memory and retries it
after reconnecting; NATS outages are ridden out by the client's reconnects.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
from nats.errors import ConnectionClosedError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import APIError, NotFoundError
from psycopg import AsyncConnection

from services.projector.messages import RawMessage, decode_message
from services.projector.projection import Changes, Projection, job_ids_to_load
from services.projector.rows import QuarantineRow
from services.projector.store import ProjectionStore

log = logging.getLogger(__name__)


def raw_from_msg(stream: str, msg: Any) -> RawMessage:
    return RawMessage(
        stream=stream,
        seq=msg.metadata.sequence.stream,
        subject=msg.subject,
        data=msg.data,
        headers=dict(msg.headers) if msg.headers else None,
    )


async def ensure_consumer(js: JetStreamContext, stream: str, durable: str, batch: int) -> None:
    config = ConsumerConfig(
        durable_name=durable,
        ack_policy=AckPolicy.ALL,
        deliver_policy=DeliverPolicy.ALL,
        ack_wait=60.0,
        max_ack_pending=batch * 4,
        max_waiting=16,
        description="lodestream projector: folds the log into the Postgres read models",
    )
    try:
        await js.consumer_info(stream, durable)
    except NotFoundError:
        await js.add_consumer(stream, config)


class Projector:
    """Folds one stream (EVENTS or HB) into the read models of one schema."""

    def __init__(
        self,
        js: JetStreamContext,
        dsn: str,
        *,
        stream: str,
        durable: str,
        batch_size: int,
        fetch_timeout_s: float,
        store: ProjectionStore,
    ) -> None:
        self._js = js
        self._dsn = dsn
        self._stream = stream
        self._durable = durable
        self._batch_size = batch_size
        self._fetch_timeout_s = fetch_timeout_s
        self._store = store
        self._conn: AsyncConnection[Any] | None = None
        self.applied = 0

    async def run(self, stop: asyncio.Event) -> None:
        await ensure_consumer(self._js, self._stream, self._durable, self._batch_size)
        sub = await self._js.pull_subscribe_bind(self._durable, stream=self._stream)
        try:
            while not stop.is_set():
                try:
                    msgs = await sub.fetch(self._batch_size, timeout=self._fetch_timeout_s)
                except NatsTimeoutError:
                    continue
                except (ConnectionClosedError, NoRespondersError, APIError) as exc:
                    log.warning("projector %s: fetch failed (%s); retrying", self._stream, exc)
                    await asyncio.sleep(0.5)
                    continue
                raws = [raw_from_msg(self._stream, m) for m in msgs]
                if await self.apply(raws, stop):
                    await msgs[-1].ack()
        finally:
            await sub.unsubscribe()
            if self._conn is not None:
                await self._conn.close()

    async def apply(self, raws: list[RawMessage], stop: asyncio.Event | None = None) -> bool:
        """Apply one batch, retrying the same batch until Postgres takes it.

        Returns False only when asked to stop before the batch was committed;
        the unacked batch is then redelivered to the next projector.
        """
        decoded = [decode_message(r) for r in raws]
        delay = 0.1
        while True:
            try:
                await self._apply_once(raws, decoded)
            except psycopg.OperationalError as exc:
                log.warning("projector %s: postgres unavailable (%s); retrying", self._stream, exc)
            except (psycopg.errors.UndefinedTable, psycopg.errors.InternalError_) as exc:
                # A rebuild swapped the schema under us: retry against the new tables.
                log.info("projector %s: tables replaced (%s); retrying", self._stream, exc)
            else:
                return True
            if self._conn is not None:
                await self._conn.close()
                self._conn = None
            if stop is not None and stop.is_set():
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _connection(self) -> AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = await AsyncConnection.connect(self._dsn)
        return self._conn

    async def _apply_once(self, raws: list[RawMessage], decoded: list[Any]) -> None:
        conn = await self._connection()
        async with conn.transaction():
            # The read model is derived from the log: a commit lost in a crash is re-applied
            # from NATS, so waiting for the WAL flush would buy nothing.
            await conn.execute("SET LOCAL synchronous_commit = off")
            position = await self._store.lock_position(conn, self._stream)
            pending = [(r, d) for r, d in zip(raws, decoded, strict=True) if r.seq > position]
            if not pending:
                return
            known = await self._store.load_known(
                conn, job_ids_to_load(d for _, d in pending if not isinstance(d, QuarantineRow))
            )
            changes = Changes()
            projection = Projection(known, changes)
            for raw, item in pending:
                projection.fold(raw, item)
            await self._store.write(conn, changes)
        self.applied += len(pending)
        if changes.quarantine:
            for q in changes.quarantine:
                log.warning("quarantined %s seq %d (%s): %s", q.stream, q.seq, q.subject, q.reason)
