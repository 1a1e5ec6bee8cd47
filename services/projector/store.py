"""Postgres side of the projector: load what a batch folds onto, write what it changed.

Everything for one batch — rows, quarantine and the stream position — is
written in the caller's transaction. The hot path (jobs and job_events) uses
COPY; the low-volume aggregates use one statement per event, in log order.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, LiteralString

import orjson
import psycopg
from psycopg import AsyncConnection, abc, adapt, postgres, pq, sql
from psycopg.types.json import set_json_loads

from lodestream.schemas.resources import BatchJobState, TransferState
from lodestream.services.projector.projection import Changes, Known, Op
from lodestream.services.projector.rows import (
    JOB_COLUMNS,
    JOB_COPY_TYPES,
    JOB_EVENT_COLUMNS,
    JOB_EVENT_COPY_TYPES,
    PROGRESS_COLUMNS,
    PROGRESS_TYPES,
    JobProgress,
    QuarantineRow,
)

_OPS: Final[dict[str, LiteralString]] = {
    "site_registered": """
        INSERT INTO {s}.sites (name, id, owner, description, public_key, created_at, last_seq)
        VALUES (%(site)s, %(id)s, %(owner)s, %(description)s, %(public_key)s, %(at)s, %(seq)s)
        ON CONFLICT (name) DO UPDATE SET id = EXCLUDED.id, owner = EXCLUDED.owner,
            description = EXCLUDED.description, public_key = EXCLUDED.public_key,
            created_at = EXCLUDED.created_at, removed_at = NULL, last_seq = EXCLUDED.last_seq""",
    "site_key_bound": """
        UPDATE {s}.sites SET public_key = %(public_key)s, last_seq = %(seq)s
        WHERE name = %(site)s""",
    "site_removed": """
        UPDATE {s}.sites SET removed_at = %(at)s, public_key = NULL, last_seq = %(seq)s
        WHERE name = %(site)s""",
    "app_upserted": """
        INSERT INTO {s}.apps (site, name, description, parameters, transfers, python, hooks,
                              updated_at, last_seq, version, error)
        VALUES (%(site)s, %(name)s, %(description)s, %(parameters)s, %(transfers)s, %(python)s,
                %(hooks)s, %(at)s, %(seq)s, %(version)s, NULL)
        ON CONFLICT (site, name) DO UPDATE SET description = EXCLUDED.description,
            parameters = EXCLUDED.parameters, transfers = EXCLUDED.transfers,
            python = EXCLUDED.python, hooks = EXCLUDED.hooks, updated_at = EXCLUDED.updated_at,
            last_seq = EXCLUDED.last_seq, version = EXCLUDED.version, error = NULL""",
    "app_load_failed": """
        UPDATE {s}.apps SET error = %(error)s, last_seq = %(seq)s
        WHERE site = %(site)s AND name = ANY(%(names)s)""",
    "app_removed": "DELETE FROM {s}.apps WHERE site = %(site)s AND name = %(name)s",
    "batch_requested": """
        INSERT INTO {s}.batch_jobs (id, site, state, num_nodes, wall_time_min, queue, project,
                                    job_mode, filter_tags, options, created_at, updated_at,
                                    last_seq, requested_by)
        VALUES (%(id)s, %(site)s, 'requested', %(num_nodes)s, %(wall_time_min)s, %(queue)s,
                %(project)s, %(job_mode)s, %(filter_tags)s, %(options)s, %(at)s, %(at)s,
                %(seq)s, %(requested_by)s)
        ON CONFLICT (id) DO NOTHING""",
    "batch_state": """
        UPDATE {s}.batch_jobs SET state = %(state)s,
            scheduler_id = COALESCE(%(scheduler_id)s, scheduler_id),
            scheduler = COALESCE(%(scheduler)s, scheduler),
            scheduler_state = COALESCE(%(scheduler_state)s, scheduler_state),
            exit_code = COALESCE(%(exit_code)s, exit_code), reason = COALESCE(%(reason)s, reason),
            updated_at = %(at)s, last_seq = %(seq)s
        WHERE id = %(id)s AND site = %(site)s""",
    "scaler_backlog": """
        INSERT INTO {s}.scalers (site, scaler_id, backlog, backlog_seq, backlog_at, last_seq)
        VALUES (%(site)s, %(scaler_id)s, %(backlog)s, %(seq)s, %(at)s, %(seq)s)
        ON CONFLICT (site) DO UPDATE SET backlog = EXCLUDED.backlog,
            backlog_seq = EXCLUDED.backlog_seq, backlog_at = EXCLUDED.backlog_at,
            last_seq = EXCLUDED.last_seq""",
    "scaler_decided": """
        INSERT INTO {s}.scalers (site, scaler_id, decision_seq, decided_at, last_seq)
        VALUES (%(site)s, %(scaler_id)s, %(seq)s, %(at)s, %(seq)s)
        ON CONFLICT (site) DO UPDATE SET decision_seq = EXCLUDED.decision_seq,
            decided_at = EXCLUDED.decided_at, last_seq = EXCLUDED.last_seq""",
    "scaler_decision": """
        INSERT INTO {s}.scaler_decisions (seq, site, id, decided_at, backlog_id, queued, running,
                                          reason, requests, deletions, inputs)
        VALUES (%(seq)s, %(site)s, %(id)s, %(at)s, %(backlog_id)s, %(queued)s, %(running)s,
                %(reason)s, %(requests)s, %(deletions)s, %(inputs)s)
        ON CONFLICT (seq) DO NOTHING""",
    "session_opened": """
        INSERT INTO {s}.sessions (id, site, batch_job_id, hostname, mode, nodes, deadline,
                                  heartbeat_ttl_s, state, opened_at, last_seq)
        VALUES (%(id)s, %(site)s, %(batch_job_id)s, %(hostname)s, %(mode)s, %(nodes)s,
                %(deadline)s, %(heartbeat_ttl_s)s, 'open', %(at)s, %(seq)s)
        ON CONFLICT (id) DO NOTHING""",
    "session_ended": """
        UPDATE {s}.sessions SET state = %(state)s, closed_at = %(at)s,
            close_reason = %(reason)s, last_seq = %(seq)s
        WHERE id = %(id)s AND site = %(site)s""",
    "heartbeat": """
        UPDATE {s}.sessions SET last_heartbeat = %(at)s, heartbeat = %(heartbeat)s
        WHERE id = %(id)s AND site = %(site)s""",
    "session_expired": """
        UPDATE {s}.sessions SET state = 'expired'
        WHERE id = %(id)s AND site = %(site)s AND state = 'open'""",
    "xfer_requested": """
        INSERT INTO {s}.transfer_items (id, site, job_id, slot, direction, remote, local_path,
                                        state, updated_at, requested_at, step_id, last_seq)
        VALUES (%(id)s, %(site)s, %(job_id)s, %(slot)s, %(direction)s, %(remote)s,
                %(local_path)s, 'pending', %(at)s, %(at)s, %(step_id)s, %(seq)s)
        ON CONFLICT (id) DO NOTHING""",
    "xfer_state": """
        UPDATE {s}.transfer_items SET state = %(state)s, task_id = COALESCE(%(task_id)s, task_id),
            reason = COALESCE(%(reason)s, reason), attempts = COALESCE(%(attempts)s, attempts),
            permanent = COALESCE(%(permanent)s, permanent),
            bytes_transferred = COALESCE(%(bytes_transferred)s, bytes_transferred),
            duration_s = COALESCE(%(duration_s)s, duration_s),
            cached = COALESCE(%(cached)s, cached),
            updated_at = %(at)s, last_seq = %(seq)s
        WHERE id = %(id)s AND site = %(site)s""",
    "site_locations": """
        UPDATE {s}.sites SET transfer_locations = %(locations)s, last_seq = %(seq)s
        WHERE name = %(site)s AND removed_at IS NULL""",
}


# A batch moving on at most this many jobs updates them by key (progress_update), a larger
# one by a join (progress_join): see both.
BY_KEY_MAX: Final = 256

# Where a large batch's progress rows are copied (progress_join): the progress columns,
# emptied at every commit.
_PROGRESS_TABLE: Final = sql.SQL(
    "CREATE TEMP TABLE IF NOT EXISTS job_progress ({columns}) ON COMMIT DELETE ROWS"
).format(
    columns=sql.SQL(", ").join(
        sql.SQL("{c} {t}").format(c=sql.Identifier(c), t=sql.SQL(t))
        for c, t in zip(PROGRESS_COLUMNS, PROGRESS_TYPES, strict=True)
    )
)


def _progress_assignments() -> sql.Composed:
    return sql.SQL(", ").join(
        sql.SQL("{c} = p.{c}").format(c=sql.Identifier(c)) for c in PROGRESS_COLUMNS[1:]
    )


class JsonbTextBinaryDumper(adapt.Dumper):
    """jsonb in binary COPY from the JSON text that ``rows.py`` serialised.

    psycopg's own jsonb dumpers serialise a Python object; given a str they would
    store a JSON string. jsonb's binary input is a version byte, 1, then the text,
    which the server parses as it parses text input: the stored value is the same.
    """

    format = pq.Format.BINARY
    oid = postgres.types["jsonb"].oid

    def __init__(self, cls: type, context: abc.AdaptContext | None = None) -> None:
        super().__init__(cls, context)
        conn = self.connection
        self._encoding = conn.info.encoding if conn is not None else "utf-8"

    def dump(self, obj: str) -> bytes:
        return b"\x01" + obj.encode(self._encoding)


@dataclass(frozen=True, slots=True)
class Rows:
    """What one batch writes: its changes as the values the COPYs and statements send.

    :meth:`taken` makes the values at once. The live projector folds the next batch while
    this one is written, onto the same job objects: values made lazily, during the COPY,
    could hold that next batch's progress. The rebuild, which folds nothing meanwhile,
    writes from :meth:`of`'s generators instead of holding a million tuples.
    """

    new_jobs: Iterable[tuple[Any, ...]]
    progress: Iterable[tuple[Any, ...]]
    job_events: Iterable[tuple[Any, ...]]
    ops: Sequence[Op]
    quarantine: Sequence[QuarantineRow]
    last_seq: dict[str, int]
    has_jobs: bool
    has_progress: bool
    has_job_events: bool

    @classmethod
    def of(cls, changes: Changes) -> Rows:
        return cls(
            new_jobs=(r.to_copy() for r in changes.new_jobs.values()),
            progress=(p.to_copy() for p in changes.updated_jobs.values()),
            job_events=(e.to_copy() for e in changes.job_events),
            ops=changes.ops,
            quarantine=changes.quarantine,
            last_seq=changes.last_seq,
            has_jobs=bool(changes.new_jobs),
            has_progress=bool(changes.updated_jobs),
            has_job_events=bool(changes.job_events),
        )

    @classmethod
    def taken(cls, changes: Changes) -> Rows:
        rows = cls.of(changes)
        return cls(
            new_jobs=list(rows.new_jobs),
            progress=list(rows.progress),
            job_events=list(rows.job_events),
            ops=list(changes.ops),
            quarantine=list(changes.quarantine),
            last_seq=dict(changes.last_seq),
            has_jobs=rows.has_jobs,
            has_progress=rows.has_progress,
            has_job_events=rows.has_job_events,
        )


@dataclass(frozen=True, slots=True)
class Position:
    """A stream's applied sequence, and which transaction last wrote it (the row's xmin).

    Equal positions mean nobody else wrote the row in between: no other projector, no
    rebuild swapping its tables in (the live projector's cache relies on that).
    """

    seq: int
    writer: int


def _q(template: LiteralString, schema: str) -> sql.Composed:
    return sql.SQL(template).format(s=sql.Identifier(schema))


def _columns(names: Sequence[str]) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


class ProjectionStore:
    """Reads and writes the read models in one schema (``rm`` live, ``rm_rebuild`` for rebuilds)."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        # Composed once: every batch that moves jobs on runs one of them.
        self.progress_update = self._progress_update()
        self.progress_join = self._progress_join()

    @staticmethod
    async def prepare(conn: AsyncConnection[Any], *, wait_for_wal: bool = True) -> None:
        """Make ``conn`` ready to :meth:`write`: once per connection, not once per batch.

        ``wait_for_wal=False`` is for the live projector: the read model is derived from the
        log, and a commit lost in a crash is applied again from NATS, so waiting for the
        WAL flush would buy nothing. The setting outlives this transaction (it commits).
        """
        ProjectionStore.adapt(conn)
        if wait_for_wal:
            return
        async with conn.transaction():
            await conn.execute("SET synchronous_commit = off")

    @staticmethod
    def adapt(conn: AsyncConnection[Any]) -> None:
        """Read ``conn``'s JSON with orjson. A batch that loads its jobs decodes each one's
        ``stage_times``; with psycopg's default (the stdlib's ``json``) that was 3.5 % of
        a catch-up's samples (py-spy), most of the load. Only values this projector wrote
        are read back, and ``rows.py`` wrote them with orjson."""
        set_json_loads(orjson.loads, conn)

    async def lock_position(self, conn: AsyncConnection[Any], stream: str) -> int:
        """Lock and return the applied sequence of ``stream``; serialises projector writers."""
        return (await self.lock(conn, stream)).seq

    async def lock(self, conn: AsyncConnection[Any], stream: str) -> Position:
        """Lock the position row of ``stream``; return it with the transaction that wrote it."""
        select = _q(
            "SELECT seq, xmin::text::bigint FROM {s}.projector_position "
            "WHERE stream = %s FOR UPDATE",
            self.schema,
        )
        row = await (await conn.execute(select, (stream,))).fetchone()
        if row is None:  # a stream's first batch ever
            await conn.execute(
                _q(
                    "INSERT INTO {s}.projector_position (stream, seq, updated_at) "
                    "VALUES (%s, 0, now()) ON CONFLICT (stream) DO NOTHING",
                    self.schema,
                ),
                (stream,),
            )
            row = await (await conn.execute(select, (stream,))).fetchone()
        assert row is not None
        return Position(int(row[0]), int(row[1]))

    async def load_known(
        self,
        conn: AsyncConnection[Any],
        job_ids: Iterable[uuid.UUID],
        batch_ids: Iterable[uuid.UUID] = (),
        xfer_ids: Iterable[uuid.UUID] = (),
    ) -> Known:
        """What a batch naming these aggregates folds onto, the live sites' owners included."""
        known = Known()
        cursor = await conn.execute(
            _q("SELECT name, owner FROM {s}.sites WHERE removed_at IS NULL", self.schema)
        )
        known.site_owners = dict(await cursor.fetchall())
        await self.load_into(conn, known, job_ids, batch_ids, xfer_ids)
        return known

    async def load_into(
        self,
        conn: AsyncConnection[Any],
        known: Known,
        job_ids: Iterable[uuid.UUID],
        batch_ids: Iterable[uuid.UUID] = (),
        xfer_ids: Iterable[uuid.UUID] = (),
    ) -> None:
        """Add the rows of these aggregates to ``known`` (ids without a row add nothing)."""
        items = list(xfer_ids)
        if items:
            cursor = await conn.execute(
                _q(
                    "SELECT id, site, state FROM {s}.transfer_items WHERE id = ANY(%b)", self.schema
                ),
                (items,),
            )
            for row in await cursor.fetchall():
                known.xfer_states[row[0]] = (row[1], TransferState(row[2]))
        wanted = list(batch_ids)
        if wanted:
            cursor = await conn.execute(
                _q("SELECT id, state FROM {s}.batch_jobs WHERE id = ANY(%b)", self.schema),
                (wanted,),
            )
            for row in await cursor.fetchall():
                known.batch_states[row[0]] = BatchJobState(row[1])
        ids = list(job_ids)
        if ids:
            select = sql.SQL("SELECT id, site, {cols} FROM {s}.jobs WHERE id = ANY(%b)").format(
                cols=_columns(PROGRESS_COLUMNS[1:]), s=sql.Identifier(self.schema)
            )
            cursor = await conn.execute(select, (ids,))
            for row in await cursor.fetchall():
                progress = JobProgress.from_row(row)
                known.jobs[progress.view.id] = progress

    async def write(
        self, conn: AsyncConnection[Any], changes: Changes | Rows
    ) -> dict[str, Position]:
        """Write ``changes``; return the positions written, each with this transaction's id."""
        rows = changes if isinstance(changes, Rows) else Rows.of(changes)
        await self.write_jobs(conn, rows)
        for op in rows.ops:
            await self._execute(conn, op)
        if rows.quarantine:
            async with conn.cursor() as cursor:
                await cursor.executemany(
                    _q(
                        "INSERT INTO {s}.quarantine (stream, seq, subject, reason, raw, "
                        "quarantined_at) VALUES (%s, %s, %s, %s, %s, now()) "
                        "ON CONFLICT DO NOTHING",
                        self.schema,
                    ),
                    [(q.stream, q.seq, q.subject, q.reason, q.raw) for q in rows.quarantine],
                )
        written: dict[str, Position] = {}
        for stream, seq in rows.last_seq.items():
            cursor = await conn.execute(
                _q(
                    "UPDATE {s}.projector_position SET seq = GREATEST(seq, %s), updated_at = now() "
                    "WHERE stream = %s RETURNING seq, xmin::text::bigint",
                    self.schema,
                ),
                (seq, stream),
            )
            row = await cursor.fetchone()
            if row is not None:
                written[stream] = Position(int(row[0]), int(row[1]))
        return written

    async def write_jobs(self, conn: AsyncConnection[Any], changes: Changes | Rows) -> None:
        rows = changes if isinstance(changes, Rows) else Rows.of(changes)
        cursor = conn.cursor()
        if rows.has_jobs:
            table = self._table("jobs")
            await self._copy(cursor, table, JOB_COLUMNS, JOB_COPY_TYPES, rows.new_jobs)
        if rows.has_progress:
            progress = list(rows.progress)
            if len(progress) <= BY_KEY_MAX:
                columns = [list(column) for column in zip(*progress, strict=True)]
                await conn.execute(self.progress_update, columns)
            else:
                await conn.execute(_PROGRESS_TABLE)
                await self._copy(
                    cursor, sql.Identifier("job_progress"), PROGRESS_COLUMNS, PROGRESS_TYPES,
                    progress,
                )  # fmt: skip
                await conn.execute(self.progress_join)
        if rows.has_job_events:
            await self._copy(
                cursor, self._table("job_events"), JOB_EVENT_COLUMNS, JOB_EVENT_COPY_TYPES,
                rows.job_events,
            )  # fmt: skip
        await cursor.close()

    def _progress_update(self) -> sql.Composed:
        """The UPDATE of jobs from a few progress rows, one array per column, found by key.

        Unnested arrays are estimated at a few rows, so each job is looked up by its key.
        (Given as a temporary table, never analysed, they were taken for 430 rows and
        joined to all of jobs by hashing it: 20 ms a live batch of tens of jobs at 50,000
        jobs, growing with the table.)
        """
        # Sent binary (%b): psycopg dumps a list given as %s in text, quoting element by
        # element. Measured (bench/RESULTS.md, seventh session): the client's CPU a row
        # 86-97 us against 60-63 in batches of 30, 46-53 against 14-17 in batches of 200;
        # the backend's the same or less. The same goes for the ids of ANY(%b).
        arrays = sql.SQL(", ").join(
            sql.SQL("%b::{t}[]").format(t=sql.SQL(t)) for t in PROGRESS_TYPES
        )
        return sql.SQL(
            "UPDATE {s}.jobs j SET {a} FROM unnest({arrays}) AS p ({names}) WHERE j.id = p.id"
        ).format(
            s=sql.Identifier(self.schema), a=_progress_assignments(), arrays=arrays,
            names=_columns(PROGRESS_COLUMNS),
        )  # fmt: skip

    def _progress_join(self) -> sql.Composed:
        """The UPDATE of jobs from many progress rows, copied into ``job_progress``.

        Thousands of rows are better joined by hashing jobs than looked up one by one: on a
        read model of 150,000 jobs the catch-up ran at 18,100 events/s this way against
        10,700-12,900 by key (measured, batches of 2,000).
        """
        return sql.SQL("UPDATE {s}.jobs j SET {a} FROM job_progress p WHERE j.id = p.id").format(
            s=sql.Identifier(self.schema), a=_progress_assignments()
        )

    def _table(self, name: str) -> sql.Composable:
        return sql.Identifier(self.schema, name)

    @staticmethod
    async def _copy(
        cursor: Any,
        table: sql.Composable,
        columns: Sequence[str],
        types: Sequence[str],
        rows: Iterable[tuple[Any, ...]],
    ) -> None:
        """Binary COPY of ``rows`` into ``table``, each column dumped as its declared type.

        psycopg's C dumpers write binary uuids, integers and timestamps several times
        cheaper than text, and the server reads them without parsing (measured:
        client 1.3 against 4.4 us a job_events row, backend 3.5 against 5.0-5.5).
        """
        copy = sql.SQL("COPY {t} ({cols}) FROM STDIN (FORMAT BINARY)").format(
            t=table, cols=_columns(columns)
        )
        # By oid only, on this cursor only: the jsonb columns get the JSON text that
        # rows.py made, as it is.
        cursor.adapters.register_dumper(None, JsonbTextBinaryDumper)
        try:
            async with cursor.copy(copy) as out:
                out.set_types(list(types))
                for row in rows:
                    await out.write_row(row)
        except OverflowError as exc:
            # A binary dumper refuses an integer too large for its column in the client,
            # where the server refused it as a DataError from text: keep it one (the
            # consumer quarantines the message that holds it).
            raise psycopg.DataError(f"COPY into {table!r}: {exc}") from exc

    async def _execute(self, conn: AsyncConnection[Any], op: Op) -> None:
        await conn.execute(_q(_OPS[op.statement], self.schema), op.params)
