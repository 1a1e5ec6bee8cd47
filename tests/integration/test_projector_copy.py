"""The projector's binary COPY stores exactly what psycopg's text ``write_row`` stored.

Each case writes the same rows twice into real Postgres, once through
psycopg's text COPY (the path the projector used before) and once through
``ProjectionStore._copy`` (binary, each column as its declared type), into two
tables of the same shape, and requires the two to hold equal rows, and the
store's rows to read back as the Python values they were made from.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import orjson
import psycopg
import pytest
from psycopg import sql

from lodestream.services.projector.consumer import UNSTORABLE
from lodestream.services.projector.rows import (
    JOB_COLUMNS,
    JOB_COPY_TYPES,
    JOB_EVENT_COLUMNS,
    JOB_EVENT_COPY_TYPES,
    PROGRESS_COLUMNS,
    PROGRESS_TYPES,
)
from lodestream.services.projector.store import ProjectionStore

# Every character that COPY's text format, the array syntax or JSON give a meaning,
# the end-of-data marker, NULL's spelling, and text outside ASCII.
NASTY = (
    "", "plain", "tab\there", "new\nline", "carriage\rreturn", "crlf\r\n", "back\\slash",
    "trailing\\", "\\", "\\\\", "\\N", "\\.", "\\t", 'double "quotes"', "single 'quotes'",
    "comma, separated", "{braces}", " spaces around ", "NULL", "null", "\b\f\v\x01\x7f controls",
    "unicode é ß 漢字 🚀", "\u2028line separator",
)  # fmt: skip
ZONES = (UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8)))


def nasty_json(i: int) -> str:
    value = {"k": NASTY[i % len(NASTY)], NASTY[(i + 1) % len(NASTY)]: [NASTY[(i + 2) % len(NASTY)]]}
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def moment(i: int) -> datetime:
    # Whole seconds too: isoformat() then leaves the fraction out.
    at = datetime(2026, 1, 2, 3, 4, 5, 0 if i % 2 else 123456, tzinfo=UTC) + timedelta(hours=i)
    return at.astimezone(ZONES[i % len(ZONES)])


def job_rows() -> list[tuple[Any, ...]]:
    rows = []
    for i, s in enumerate(NASTY):
        parents = [uuid.uuid4() for _ in range(i % 3)]
        rows.append(
            (uuid.uuid4(), s, s, s, s, s, nasty_json(i), nasty_json(i + 1), "{}", "[]",
             nasty_json(i + 2), parents, None if i % 2 else i, None if i % 3 else uuid.uuid4(),
             i, None if i % 2 else -i, None if i % 4 == 0 else s, i, i + 1, moment(i),
             moment(i + 1), '{"job.started":"2026-01-02T03:04:05+00:00"}')
        )  # fmt: skip
    return rows


def progress_rows() -> list[tuple[Any, ...]]:
    return [
        (uuid.uuid4(), s, i, uuid.uuid4() if i % 2 else None, i, None if i % 3 else 255,
         None if i % 2 else s, i, moment(i), nasty_json(i))
        for i, s in enumerate(NASTY)
    ]  # fmt: skip


def job_event_rows() -> list[tuple[Any, ...]]:
    return [
        (i + 1, uuid.uuid4(), uuid.uuid4(), s, s, None if i % 2 else s, None if i % 3 else s,
         moment(i), s, nasty_json(i))
        for i, s in enumerate(NASTY)
    ]  # fmt: skip


async def copy_both_ways(
    database_url: str,
    like: str,
    columns: Sequence[str],
    types: Sequence[str],
    rows: list[tuple[Any, ...]],
) -> list[tuple[Any, ...]]:
    """COPY ``rows`` with text write_row and with the store; return the store's rows."""
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        for name in ("by_psycopg", "by_store"):
            await conn.execute(
                sql.SQL("CREATE TEMP TABLE {t} AS SELECT {cols} FROM {like} LIMIT 0").format(
                    t=sql.Identifier(name), cols=cols, like=sql.SQL(like)
                )
            )
        cursor = conn.cursor()
        reference = sql.SQL("COPY by_psycopg ({cols}) FROM STDIN").format(cols=cols)
        async with cursor.copy(reference) as out:
            for row in rows:
                await out.write_row(row)
        await ProjectionStore._copy(cursor, sql.Identifier("by_store"), columns, types, rows)
        for a, b in (("by_psycopg", "by_store"), ("by_store", "by_psycopg")):
            await cursor.execute(
                sql.SQL("SELECT * FROM {} EXCEPT ALL SELECT * FROM {}").format(
                    sql.Identifier(a), sql.Identifier(b)
                )
            )
            assert await cursor.fetchall() == [], f"rows in {a} and not in {b}"
        await cursor.execute("SELECT * FROM by_store")
        return await cursor.fetchall()


def as_stored(row: tuple[Any, ...], json_columns: set[int]) -> tuple[Any, ...]:
    """What psycopg reads back for ``row``: jsonb parsed, everything else as it was."""
    return tuple(orjson.loads(v) if i in json_columns else v for i, v in enumerate(row))


def by_first(rows: Sequence[tuple[Any, ...]]) -> dict[Any, tuple[Any, ...]]:
    return {row[0]: row for row in rows}


async def test_job_rows_store_what_write_row_stored(database_url: str) -> None:
    rows = job_rows()
    stored = await copy_both_ways(database_url, "rm.jobs", JOB_COLUMNS, JOB_COPY_TYPES, rows)
    json_columns = {JOB_COLUMNS.index(c) for c in JOB_COLUMNS if c in _JOB_JSON}
    assert by_first(stored) == by_first([as_stored(r, json_columns) for r in rows])


async def test_progress_rows_store_what_write_row_stored(database_url: str) -> None:
    rows = progress_rows()
    stored = await copy_both_ways(database_url, "rm.jobs", PROGRESS_COLUMNS, PROGRESS_TYPES, rows)
    json_columns = {PROGRESS_COLUMNS.index("stage_times")}
    assert by_first(stored) == by_first([as_stored(r, json_columns) for r in rows])


async def test_job_event_rows_store_what_write_row_stored(database_url: str) -> None:
    rows = job_event_rows()
    stored = await copy_both_ways(
        database_url, "rm.job_events", JOB_EVENT_COLUMNS, JOB_EVENT_COPY_TYPES, rows
    )
    json_columns = {JOB_EVENT_COLUMNS.index("data")}
    assert by_first(stored) == by_first([as_stored(r, json_columns) for r in rows])


@pytest.mark.parametrize(
    "elements",
    [[], [""], list(NASTY), [None, "a", None], ["NULL", "null", "Null"], ["{", "}", ","]],
    ids=["empty", "empty-string", "nasty", "nulls", "null-spellings", "syntax"],
)
async def test_text_arrays_store_what_write_row_stored(
    database_url: str, elements: list[str | None]
) -> None:
    rows: list[tuple[Any, ...]] = [(1, elements)]
    stored = await copy_both_ways(
        database_url,
        "(SELECT 1::int AS n, ARRAY[]::text[] AS a) AS shape",
        ("n", "a"),
        ("int4", "text[]"),
        rows,
    )
    assert stored == rows


@pytest.mark.parametrize(
    ("column", "value"),
    [("site", "nul\x00inside"), ("data", '{"k":"\\u0000"}'), ("seq", 2**63)],
    ids=["nul-in-text", "nul-in-jsonb", "int8-overflow"],
)
async def test_a_value_postgres_cannot_store_is_an_unstorable_error(
    database_url: str, column: str, value: object
) -> None:
    # The consumer quarantines a message whose row raises one of UNSTORABLE: the binary
    # path must refuse what the text path refused, with an error of the same kind.
    row = list(job_event_rows()[1])
    row[JOB_EVENT_COLUMNS.index(column)] = value
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        with pytest.raises(UNSTORABLE):
            await ProjectionStore._copy(
                conn.cursor(),
                sql.Identifier("rm", "job_events"),
                JOB_EVENT_COLUMNS,
                JOB_EVENT_COPY_TYPES,
                [tuple(row)],
            )


_JOB_JSON = {"parameters", "tags", "data", "resources", "transfers", "stage_times"}
