"""The projector's COPY text lines store exactly what psycopg's ``write_row`` stored.

Each case writes the same rows twice into real Postgres, once through
psycopg's own per-row formatting (the path the projector used before) and
once through ``copy_text``, into two tables of the same shape, and requires
the two to hold equal rows, and the copy_text rows to read back as the Python
values they were made from.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import orjson
import psycopg
import pytest
from psycopg import sql

from lodestream.services.projector import copy_text, store
from lodestream.services.projector.rows import JOB_COLUMNS, JOB_EVENT_COLUMNS, PROGRESS_COLUMNS
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
    rows: list[tuple[Any, ...]],
    line: Callable[[tuple[Any, ...]], str],
) -> list[tuple[Any, ...]]:
    """COPY ``rows`` with write_row and with ``line``; return the ``line`` rows read back."""
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        for name in ("by_psycopg", "by_lines"):
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
        ours = sql.SQL("COPY by_lines ({cols}) FROM STDIN").format(cols=cols)
        async with cursor.copy(ours) as out:
            await out.write("".join(line(row) for row in rows))
        for a, b in (("by_psycopg", "by_lines"), ("by_lines", "by_psycopg")):
            await cursor.execute(
                sql.SQL("SELECT * FROM {} EXCEPT ALL SELECT * FROM {}").format(
                    sql.Identifier(a), sql.Identifier(b)
                )
            )
            assert await cursor.fetchall() == [], f"rows in {a} and not in {b}"
        await cursor.execute("SELECT * FROM by_lines")
        return await cursor.fetchall()


def as_stored(row: tuple[Any, ...], json_columns: set[int]) -> tuple[Any, ...]:
    """What psycopg reads back for ``row``: jsonb parsed, everything else as it was."""
    return tuple(orjson.loads(v) if i in json_columns else v for i, v in enumerate(row))


def by_first(rows: Sequence[tuple[Any, ...]]) -> dict[Any, tuple[Any, ...]]:
    return {row[0]: row for row in rows}


async def test_job_lines_store_what_write_row_stored(database_url: str) -> None:
    rows = job_rows()
    stored = await copy_both_ways(database_url, "rm.jobs", JOB_COLUMNS, rows, copy_text.job_line)
    json_columns = {JOB_COLUMNS.index(c) for c in JOB_COLUMNS if c in _JOB_JSON}
    assert by_first(stored) == by_first([as_stored(r, json_columns) for r in rows])


async def test_progress_lines_store_what_write_row_stored(database_url: str) -> None:
    rows = progress_rows()
    stored = await copy_both_ways(
        database_url, "rm.jobs", PROGRESS_COLUMNS, rows, copy_text.progress_line
    )
    json_columns = {PROGRESS_COLUMNS.index("stage_times")}
    assert by_first(stored) == by_first([as_stored(r, json_columns) for r in rows])


async def test_job_event_lines_store_what_write_row_stored(database_url: str) -> None:
    rows = job_event_rows()
    stored = await copy_both_ways(
        database_url, "rm.job_events", JOB_EVENT_COLUMNS, rows, copy_text.job_event_line
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

    def line(row: tuple[Any, ...]) -> str:
        return f"{row[0]:d}\t{copy_text.array(row[1])}\n"

    stored = await copy_both_ways(
        database_url, "(SELECT 1::int AS n, ARRAY[]::text[] AS a) AS shape", ("n", "a"), rows, line
    )
    assert stored == rows


def test_a_line_has_one_field_per_column_whatever_the_values_hold() -> None:
    for rows, columns, line in (
        (job_rows(), JOB_COLUMNS, copy_text.job_line),
        (progress_rows(), PROGRESS_COLUMNS, copy_text.progress_line),
        (job_event_rows(), JOB_EVENT_COLUMNS, copy_text.job_event_line),
    ):
        for row in rows:
            text = line(row)
            assert text.endswith("\n")
            assert text.count("\n") == 1
            assert "\r" not in text
            assert text.count("\t") == len(columns) - 1


def test_a_row_without_special_characters_is_formatted_once_whichever_columns_are_null(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The escaping pass must be the exception: a miscounted NULL would send every row
    # through it (slower), or let a backslash through unescaped (wrong; the tests above).
    def escaping_pass(row: tuple[Any, ...]) -> tuple[Any, ...]:
        raise AssertionError(f"escaping pass taken for {row}")

    monkeypatch.setattr(copy_text, "_escaped", escaping_pass)
    for rows, line in (
        (job_rows(), copy_text.job_line),
        (progress_rows(), copy_text.progress_line),
        (job_event_rows(), copy_text.job_event_line),
    ):
        for row in rows:
            clean = tuple("plain" if isinstance(v, str) else v for v in row)
            assert line(clean).count("\\") == sum(v is None for v in clean)


_JOB_JSON = {"parameters", "tags", "data", "resources", "transfers", "stage_times"}


async def test_the_store_copies_every_line_when_they_span_several_writes(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "_COPY_CHUNK_ROWS", 2)
    rows = job_event_rows()[:5]
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        async with conn.cursor() as cursor:
            await ProjectionStore._copy(
                cursor,
                sql.Identifier("rm", "job_events"),
                JOB_EVENT_COLUMNS,
                (copy_text.job_event_line(r) for r in rows),
            )
        await conn.commit()
        cursor = await conn.execute("SELECT seq, site FROM rm.job_events ORDER BY seq")
        assert await cursor.fetchall() == [(r[0], r[3]) for r in rows]
