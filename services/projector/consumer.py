"""The live projector loop: fetch a batch, fold it (while the one before commits), commit
rows + position, then ack.

The consumer uses AckAll: one ack after the commit covers the whole batch.
The committed position in Postgres, not the consumer's ack floor, says what
has been applied: at start, and whenever a batch does not begin right after
the position, the consumer is re-created to deliver from ``position + 1``.
(Without that, a batch left unacked by a crash would wait for ``ack_wait``
while the next batch is delivered — and AckAll on the next batch would ack
the gap away.) Messages at or below the position are skipped, so every
event is applied exactly once. A Postgres error keeps the batch in memory and
retries it; NATS outages are ridden out by the client's reconnects.

EVENTS is read as bytes (reading.py), and its reader asks for the next batch while
one is applied. That batch waits, unacked, until its own turn: an ack covers only
what was committed, a Postgres outage past ``ack_wait`` only has the server send it
again (at or below the position by then, so skipped), and a repositioning starts a
fresh inbox, so nothing read ahead from the old consumer is applied.

HB is different: per-subject limits and TTLs delete heartbeats, so its
sequences have natural gaps and only order, not contiguity, is checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Any

import nats.errors
import psycopg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from psycopg import AsyncConnection

from lodestream.eventlog.pull import PullLoop
from lodestream.eventlog.transient import transient
from lodestream.schemas.errors import first_line
from lodestream.services.projector.ahead import (
    Fold,
    InFlight,
    decode_sliced,
    fold_sliced,
    named_ids,
)
from lodestream.services.projector.cache import FoldCache
from lodestream.services.projector.messages import Decoded, RawMessage, decode_message
from lodestream.services.projector.projection import (
    Known,
    ids_to_load,
)
from lodestream.services.projector.reading import StreamReader, stream_reader
from lodestream.services.projector.rows import QuarantineRow
from lodestream.services.projector.store import Position, ProjectionStore

log = logging.getLogger(__name__)

# A delivery that is no message of the stream (ReadError, transient) is dropped by the reader
# and waited out like NATS being away; if it came amid a batch, the batch's next fetch does
# not follow the position, and the consumer is repositioned (see Gap).

# Errors that depend on a message's content (a value out of range, text Postgres cannot
# encode, a duplicate key), not on Postgres being up or granted: retrying cannot help.
UNSTORABLE = (psycopg.DataError, psycopg.IntegrityError)

# A fetch after the linger takes what is there; it waits this long only if nothing is.
LINGER_POLL_S = 0.001

# Jobs whose progress the live projector keeps between batches (see cache.py): a few
# hundred bytes each, enough for the jobs of the last minutes at the target rate.
CACHED_JOBS = 50_000


class Gap(Exception):
    """A batch does not start right after the applied position."""

    def __init__(self, position: int) -> None:
        super().__init__(f"batch does not follow position {position}")
        self.position = position


async def position_consumer(
    js: JetStreamContext,
    stream: str,
    durable: str,
    batch: int,
    start_seq: int,
    *,
    ack_wait_s: float = 60.0,
) -> None:
    """(Re)create the durable so that it delivers from ``start_seq``."""
    with contextlib.suppress(NotFoundError):
        await js.delete_consumer(stream, durable)
    await js.add_consumer(
        stream,
        ConsumerConfig(
            durable_name=durable,
            ack_policy=AckPolicy.ALL,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=max(start_seq, 1),
            ack_wait=ack_wait_s,
            # The batch being applied and the one read ahead, with room for a redelivery.
            max_ack_pending=batch * 4,
            max_waiting=16,
            description="lodestream projector: folds the log into the Postgres read models",
        ),
    )


class Projector:
    """Folds one stream (EVENTS or HB) into the read models of one schema.

    One batch is committed while the next is decoded and folded onto what the first left
    (ahead.py): at most one transaction is in flight, and a batch is acked only after its
    own commit. What was folded ahead is written only if its predecessor committed the very
    ``Known`` it was folded onto, at the position it assumed; otherwise it is thrown away,
    with that ``Known``, and the batch is folded again from the cache or from Postgres.
    """

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
        contiguous: bool = True,
        linger_s: float = 0.0,
    ) -> None:
        self._js = js
        self._dsn = dsn
        self._stream = stream
        self._durable = durable
        self._batch_size = batch_size
        self._fetch_timeout_s = fetch_timeout_s
        self._store = store
        self._contiguous = contiguous
        self._linger_s = linger_s
        self._conn: AsyncConnection[Any] | None = None
        # Reads for a batch folded ahead, while _conn is in its predecessor's transaction.
        self._loads: AsyncConnection[Any] | None = None
        self._cache = FoldCache(CACHED_JOBS)
        self._inflight: InFlight | None = None
        self.applied = 0
        self.batches = 0  # handed to _on_batch, lingered-for messages included
        self.unstorable = 0
        # Batches folded ahead, and those written so: the rest were thrown away.
        self.folded_ahead = 0
        self.written_ahead = 0

    async def run(self, stop: asyncio.Event) -> None:
        reader = stream_reader(self._js, self._stream, self._durable)
        await self._deliver_after(reader, await self._applied_position(), stop)
        pulling = PullLoop(
            reader, name=f"projector {self._stream}", batch=self._batch_size,
            timeout_s=self._fetch_timeout_s,
        )  # fmt: skip
        try:
            while not stop.is_set():
                raws = await pulling.fetch()
                if raws and len(raws) < self._batch_size and self._linger_s:
                    raws += await self._more(reader, len(raws))
                if raws:
                    await self._on_batch(reader, stop, raws)
                elif self._inflight is not None:  # idle: ack what committed, without waiting
                    await self._settle(reader, stop)
        finally:
            await self._settle(reader, stop)
            await reader.stop()
            await self.close()

    async def _more(self, reader: StreamReader, have: int) -> list[RawMessage]:
        """What came within the linger after a partial batch: it joins that batch.

        Each batch costs a transaction and a dozen statements whatever its size; at a
        live rate of a few thousand events a second, batches of tens of events spend
        more on those than on the events (measured: see ``linger_s`` in settings).
        """
        await asyncio.sleep(self._linger_s)
        try:
            return await reader.fetch(self._batch_size - have, LINGER_POLL_S)
        except Exception as exc:
            if not transient(exc):
                raise
            return []  # the next fetch reads it, or rides the outage out

    async def close(self) -> None:
        """Close the Postgres connections (:meth:`run` does on its way out)."""
        for conn in (self._conn, self._loads):
            if conn is not None:
                await conn.close()
        self._conn = self._loads = None

    async def _on_batch(
        self, reader: StreamReader, stop: asyncio.Event, raws: list[RawMessage]
    ) -> None:
        """Fold ``raws`` ahead while the batch before commits; then start its own commit."""
        mark = reader.mark()
        self.batches += 1
        decoded = await decode_sliced(raws)
        previous = self._inflight
        ahead = await self._fold_ahead(previous, raws, decoded) if previous else None
        if not await self._settle(reader, stop):
            # The batch before was not committed: this one is delivered again, and what it
            # was folded ahead onto must not be kept.
            self._cache.clear()
            return
        folded: asyncio.Future[Fold | None] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(self._commit(raws, decoded, ahead, stop, folded))
        self._inflight = InFlight(task, mark, folded, named_ids(decoded))

    async def _settle(self, reader: StreamReader, stop: asyncio.Event) -> bool:
        """Wait for the batch in flight; ack it if committed. False if it was not."""
        inflight, self._inflight = self._inflight, None
        if inflight is None:
            return True
        try:
            committed = await inflight.task
        except Gap as gap:
            log.info("projector %s: %s; re-positioning", self._stream, gap)
            await reader.stop()
            await self._deliver_after(reader, gap.position, stop)
            return False
        if committed:
            await reader.ack(inflight.mark)
        return committed

    async def _fold_ahead(
        self,
        previous: InFlight,
        raws: list[RawMessage],
        decoded: list[Decoded | QuarantineRow],
    ) -> Fold | None:
        """Fold ``raws`` onto what ``previous`` folded, before it commits; None if unsafe.

        Jobs the cache lacks are read on a second connection. That is safe for a job the
        batch in flight does not name: its row is the same before and after that commit.
        A job it names but the cache lacks is not read (it would be read stale); nor is
        anything read for a stream with gaps, where ``after`` cannot be known.
        """
        if not self._contiguous:
            return None
        await asyncio.wait((previous.folded, previous.task), return_when=asyncio.FIRST_COMPLETED)
        base = previous.folded.result() if previous.folded.done() else None
        if base is None or raws[0].seq != base.last + 1:
            return None
        known = base.known
        self._cache.trim(known)
        events = [d for d in decoded if not isinstance(d, QuarantineRow)]
        missing = _missing(known, events)
        if any(ids & previous.named for ids in missing):
            return None
        if any(missing):
            try:
                if self._loads is None or self._loads.closed:
                    self._loads = await AsyncConnection.connect(self._dsn, autocommit=True)
                    self._store.adapt(self._loads)
                await self._store.load_into(self._loads, known, *missing)
            except psycopg.Error as exc:
                log.info("projector %s: not folding ahead (%s)", self._stream, first_line(exc))
                if self._loads is not None:
                    await self._loads.close()
                    self._loads = None
                return None
        fold = await fold_sliced(known, base.last, list(zip(raws, decoded, strict=True)))
        self.folded_ahead += 1
        return fold

    async def _applied_position(self) -> int:
        while True:
            try:
                conn = await self._connection()
                async with conn.transaction():
                    return await self._store.lock_position(conn, self._stream)
            except psycopg.OperationalError as exc:
                log.warning("projector %s: postgres unavailable (%s)", self._stream, exc)
                self._conn = None
                await asyncio.sleep(1.0)

    async def _deliver_after(
        self, reader: StreamReader, position: int, stop: asyncio.Event
    ) -> None:
        """(Re)create the durable to deliver from ``position + 1`` and (re)start ``reader`` on it.

        Re-creating the durable is idempotent, so any NATS failure here (a request that
        timed out while the server restarts, no responders yet) is waited out rather than
        ending the projector: the position it must start from is already known.
        """
        delay = 0.25
        while True:
            try:
                await position_consumer(
                    self._js, self._stream, self._durable, self._batch_size, position + 1
                )
                await reader.start()
            except (nats.errors.Error, TimeoutError) as exc:
                log.warning("projector %s: cannot position the consumer after %d (%s); retrying",
                            self._stream, position, exc or type(exc).__name__)  # fmt: skip
                if stop.is_set():
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            else:
                return

    async def apply(self, raws: list[RawMessage], stop: asyncio.Event | None = None) -> bool:
        """Apply one batch, retrying the same batch until Postgres takes it.

        Returns False only when asked to stop before the batch was committed;
        the unacked batch is then redelivered to the next projector.
        """
        return await self._commit(raws, [decode_message(r) for r in raws], None, stop)

    async def _commit(
        self,
        raws: list[RawMessage],
        decoded: list[Decoded | QuarantineRow],
        ahead: Fold | None,
        stop: asyncio.Event | None,
        folded: asyncio.Future[Fold | None] | None = None,
    ) -> bool:
        """:meth:`apply`, with what was folded ahead tried first and the fold announced."""
        delay = 0.1
        singly = False
        while True:
            try:
                if singly:
                    await self._apply_singly(raws, decoded)
                else:
                    await self._apply_once(raws, decoded, ahead, folded)
            except psycopg.OperationalError as exc:
                log.warning("projector %s: postgres unavailable (%s); retrying", self._stream, exc)
            except (psycopg.errors.UndefinedTable, psycopg.errors.InternalError_) as exc:
                # A rebuild swapped the schema under us: retry against the new tables.
                log.info("projector %s: tables replaced (%s); retrying", self._stream, exc)
            except UNSTORABLE as exc:
                if singly:  # a quarantine row refused: not the messages' doing; retry later
                    log.warning("projector %s: cannot store quarantine (%s)", self._stream, exc)
                else:
                    # Some message holds what Postgres refuses: find it, quarantine it, apply
                    # the rest. Retrying the batch as it is would fail for ever.
                    log.warning("projector %s: batch refused (%s); applying one by one",
                                self._stream, first_line(exc))  # fmt: skip
                    singly, ahead = True, None
                    self._cache.clear()
                    continue
            except psycopg.ProgrammingError as exc:
                # A missing grant or a broken schema: the operator's to fix, never the
                # messages' fault, so nothing is quarantined for it.
                log.warning("projector %s: %s; retrying", self._stream, first_line(exc))
            else:
                return True
            # The transaction failed: what was folded ahead is thrown away with the cache it
            # was folded onto (which the attempt may not have taken: it can fail before
            # the lock), and a retry folds from Postgres.
            ahead = None
            self._cache.clear()
            if self._conn is not None:
                await self._conn.close()
                self._conn = None
            if stop is not None and stop.is_set():
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _apply_singly(
        self, raws: list[RawMessage], decoded: list[Decoded | QuarantineRow]
    ) -> list[Decoded | QuarantineRow]:
        """Apply message by message; quarantine each one Postgres refuses, with its reason."""
        kept: list[Decoded | QuarantineRow] = []
        for raw, item in zip(raws, decoded, strict=True):
            try:
                await self._apply_once([raw], [item])
                kept.append(item)
            except UNSTORABLE as exc:
                reason = f"unstorable: {first_line(exc)}"
                refused = QuarantineRow(raw.stream, raw.seq, raw.subject, reason, raw.data)
                self.unstorable += 1
                await self._apply_once([raw], [refused])
                kept.append(refused)
        return kept

    async def _connection(self) -> AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            conn = await AsyncConnection.connect(self._dsn)
            try:
                await self._store.prepare(conn, wait_for_wal=False)
            except BaseException:
                await conn.close()
                raise
            self._conn = conn
        return self._conn

    async def _apply_once(
        self,
        raws: list[RawMessage],
        decoded: list[Decoded | QuarantineRow],
        ahead: Fold | None = None,
        folded: asyncio.Future[Fold | None] | None = None,
    ) -> None:
        conn = await self._connection()
        async with conn.transaction():
            position = await self._store.lock(conn, self._stream)
            cached = self._cache.take(position)
            fold = await self._fold(conn, position, cached, raws, decoded, ahead=ahead)
            if folded is not None and not folded.done():
                folded.set_result(fold)
            if fold is None:
                return
            written = await self._store.write(conn, fold.rows)
        self._cache.keep(fold.known, fold.changes, written[self._stream])
        self.applied += fold.count
        self.written_ahead += fold is ahead
        for q in fold.changes.quarantine:
            log.warning("quarantined %s seq %d (%s): %s", q.stream, q.seq, q.subject, q.reason)

    async def _fold(
        self,
        conn: AsyncConnection[Any],
        position: Position,
        cached: Known | None,
        raws: list[RawMessage],
        decoded: list[Decoded | QuarantineRow],
        *,
        ahead: Fold | None,
    ) -> Fold | None:
        """The batch folded onto ``position``: as folded ahead if still valid; None if no-op."""
        if ahead is not None and cached is ahead.known:
            if position.seq == ahead.after:
                return ahead
            cached = None  # folded onto by a batch that is not written: reload
        pending = [(r, d) for r, d in zip(raws, decoded, strict=True) if r.seq > position.seq]
        if not pending:
            return None
        if self._contiguous and pending[0][0].seq != position.seq + 1:
            raise Gap(position.seq)
        events = [d for _, d in pending if not isinstance(d, QuarantineRow)]
        known = await self._known(conn, cached, events)
        return await fold_sliced(known, position.seq, pending)

    async def _known(
        self, conn: AsyncConnection[Any], cached: Known | None, events: list[Decoded]
    ) -> Known:
        """What the batch folds onto: the cache, completed from Postgres, or all from Postgres."""
        if cached is None:
            return await self._store.load_known(conn, *ids_to_load(events))
        self._cache.trim(cached)
        await self._store.load_into(conn, cached, *_missing(cached, events))
        return cached


def _missing(
    known: Known, events: list[Decoded]
) -> tuple[set[uuid.UUID], set[uuid.UUID], set[uuid.UUID]]:
    """The jobs, batch jobs and transfers ``events`` name that ``known`` lacks."""
    # Membership test by test, not ``ids - known.jobs.keys()``: a set minus a dict view
    # walks the whole view, hashing every cached job's id (tens of thousands) per batch.
    job_ids, batch_ids, xfer_ids = ids_to_load(events)
    jobs, batches, xfers = known.jobs, known.batch_states, known.xfer_states
    return (
        {i for i in job_ids if i not in jobs},
        {i for i in batch_ids if i not in batches},
        {i for i in xfer_ids if i not in xfers},
    )
