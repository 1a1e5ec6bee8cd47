"""COPY text format for the projector's hot tables: a batch's rows in one ``copy.write``.

psycopg's ``write_row`` looks up a dumper for every value and runs an ``await``
for every row; the jobs and job_events of a batch are thousands of rows whose
column types are known in advance. The lines below format the tuples that the
row classes in ``rows.py`` decide (``to_copy()``), which stay the only place
that decides values: this module only spells them in Postgres' COPY text
syntax (https://www.postgresql.org/docs/current/sql-copy.html, "Text Format").

What that syntax needs:

* columns separated by a tab, rows ended by a newline, NULL written ``\\N``;
* in a value, backslash, tab, newline and carriage return escaped with a
  backslash (any other character, control characters included, is taken
  as it is, so nothing else is escaped);
* uuids as 32 hex digits, which ``uuid_in`` accepts as psycopg sends them;
* timestamps as ``datetime.isoformat()``, which ``timestamptz_in`` reads
  with the offset it carries (a naive datetime, which no event holds, would
  be read in the session's time zone, as psycopg's own dumper sends it);
* arrays as ``{a,b}`` literals, elements quoted where the array syntax
  demands, then the whole literal escaped as any other value.

A NUL character cannot be stored in a text or jsonb column whichever way it
is sent: Postgres refuses the COPY, exactly as it refused psycopg's rows.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from typing import Any, Final

NULL: Final = "\\N"
_ESCAPES: Final = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
# An array element is quoted when it is empty, is NULL spelled as text, or holds a
# character that the array syntax gives a meaning (braces, delimiter, quote,
# backslash) or that array_in would trim (white space).
_NEEDS_QUOTES: Final = re.compile(r'^$|^null$|[{},"\\\s]', re.IGNORECASE)
_QUOTED_SPECIALS: Final = re.compile(r'(["\\])')


def text(value: str) -> str:
    """A text (or json/jsonb) value, escaped for COPY."""
    # Four scans of a short string cost less than one regex search or an
    # unconditional translate, and almost no value holds any of these.
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        return value.translate(_ESCAPES)
    return value


def array(elements: Iterable[str | None]) -> str:
    """A one-dimensional array literal of text elements (None is an SQL NULL), escaped."""
    items = []
    for element in elements:
        if element is None:
            items.append("NULL")
        elif _NEEDS_QUOTES.search(element):
            items.append('"' + _QUOTED_SPECIALS.sub(r"\\\1", element) + '"')
        else:
            items.append(element)
    return text("{" + ",".join(items) + "}")


def uuid_array(values: Iterable[uuid.UUID]) -> str:
    return array([v.hex for v in values])


def _escaped(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(text(v) if isinstance(v, str) else v for v in row)


def _plain(line: str, columns: int, nulls: int) -> bool:
    """Whether no value in ``line`` held a character that COPY needs escaped.

    Only the formatter's own delimiters, its one newline and the backslash of each
    ``\\N`` it wrote may be there: one count each, scanned in C, instead of four
    scans and a call per text value of a row that almost never needs escaping.
    """
    return (
        line.count("\t") == columns - 1
        and line.count("\n") == 1
        and line.count("\\") == nulls
        and "\r" not in line
    )


def _job(row: tuple[Any, ...]) -> str:
    (job_id, site, owner, app, state, workdir, parameters, tags, data, resources, transfers,
     parent_ids, lease_seq, lease_session, attempts, return_code, last_error, created_seq,
     last_seq, created_at, updated_at, stage_times) = row  # fmt: skip
    return (
        f"{job_id.hex}\t{site}\t{owner}\t{app}\t{state}\t{workdir}\t{parameters}\t{tags}\t"
        f"{data}\t{resources}\t{transfers}\t{uuid_array(parent_ids)}\t"
        f"{NULL if lease_seq is None else f'{lease_seq:d}'}\t"
        f"{NULL if lease_session is None else lease_session.hex}\t{attempts:d}\t"
        f"{NULL if return_code is None else f'{return_code:d}'}\t"
        f"{NULL if last_error is None else last_error}\t{created_seq:d}\t{last_seq:d}\t"
        f"{created_at.isoformat()}\t{updated_at.isoformat()}\t{stage_times}\n"
    )


def job_line(row: tuple[Any, ...]) -> str:
    """One ``rows.JOB_COLUMNS`` line from ``JobRecord.to_copy()``."""
    line = _job(row)
    nulls = (row[12] is None) + (row[13] is None) + (row[15] is None) + (row[16] is None)
    return line if _plain(line, 22, nulls) else _job(_escaped(row))


def _progress(row: tuple[Any, ...]) -> str:
    (job_id, state, lease_seq, lease_session, attempts, return_code, last_error, last_seq,
     updated_at, stage_times) = row  # fmt: skip
    return (
        f"{job_id.hex}\t{state}\t{NULL if lease_seq is None else f'{lease_seq:d}'}\t"
        f"{NULL if lease_session is None else lease_session.hex}\t{attempts:d}\t"
        f"{NULL if return_code is None else f'{return_code:d}'}\t"
        f"{NULL if last_error is None else last_error}\t{last_seq:d}\t"
        f"{updated_at.isoformat()}\t{stage_times}\n"
    )


def progress_line(row: tuple[Any, ...]) -> str:
    """One ``rows.PROGRESS_COLUMNS`` line from ``JobProgress.to_copy()``."""
    line = _progress(row)
    nulls = (row[2] is None) + (row[3] is None) + (row[5] is None) + (row[6] is None)
    return line if _plain(line, 10, nulls) else _progress(_escaped(row))


def _job_event(row: tuple[Any, ...]) -> str:
    (seq, job_id, event_id, site, type_, from_state, to_state, occurred_at, actor,
     data) = row  # fmt: skip
    return (
        f"{seq:d}\t{job_id.hex}\t{event_id.hex}\t{site}\t{type_}\t"
        f"{NULL if from_state is None else from_state}\t"
        f"{NULL if to_state is None else to_state}\t{occurred_at.isoformat()}\t{actor}\t{data}\n"
    )


def job_event_line(row: tuple[Any, ...]) -> str:
    """One ``rows.JOB_EVENT_COLUMNS`` line from ``JobEventRow.to_copy()``."""
    line = _job_event(row)
    nulls = (row[5] is None) + (row[6] is None)
    return line if _plain(line, 10, nulls) else _job_event(_escaped(row))
