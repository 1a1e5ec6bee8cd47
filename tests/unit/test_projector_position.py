"""Waiting for the projector's position, and the Core statements compiled for psycopg.

Reading the position from Postgres is tested with the API, the controller and the
projector in tests/integration; here are the wait's rules and the compiled SQL.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from sqlalchemy import bindparam, func, literal_column, select

from lodestream.infra.postgres.compiled import Compiled
from lodestream.infra.postgres.tables import jobs
from lodestream.services.projector.errors import ProjectorBehind
from lodestream.services.projector.position import _POSITION, wait_until_applied


def reader(*positions: int) -> tuple[list[int], Callable[[], Awaitable[int]]]:
    """A read that answers ``positions`` in turn, then the last one for ever."""
    left = list(positions)
    reads: list[int] = []

    async def read() -> int:
        reads.append(left[0] if len(left) == 1 else left.pop(0))
        return reads[-1]

    return reads, read


async def test_returns_the_position_once_it_reaches_the_sequence() -> None:
    reads, read = reader(3, 5, 9)
    assert await wait_until_applied(read, 5, timeout_s=60, poll_s=0) == 5
    assert reads == [3, 5]


async def test_reads_at_least_once_even_with_no_time_left() -> None:
    _, read = reader(7)
    assert await wait_until_applied(read, 7, timeout_s=0, poll_s=0) == 7


async def test_behind_when_the_time_is_up_says_where_it_was() -> None:
    _, read = reader(4)
    with pytest.raises(ProjectorBehind) as info:
        await wait_until_applied(read, 5, timeout_s=0, poll_s=0)
    assert (info.value.seq, info.value.position) == (5, 4)
    assert isinstance(info.value, TimeoutError)


def test_the_position_query_is_the_tables_primary_key_lookup() -> None:
    text = " ".join(_POSITION.sql.as_string().split())
    assert text == (
        "SELECT rm.projector_position.seq FROM rm.projector_position "
        "WHERE rm.projector_position.stream = %(stream)s"
    )
    assert _POSITION.params(stream="EVENTS") == {"stream": "EVENTS"}


def test_compiled_keeps_its_own_values_and_asks_for_the_rest() -> None:
    query = Compiled.of(
        select(jobs.c.id).where(
            jobs.c.state == bindparam("state"),
            func.cardinality(jobs.c.parent_ids) > 0,
            jobs.c.attempts > literal_column("1"),
        )
    )
    assert query.required == {"state"}
    params = query.params(state="READY")
    assert params["state"] == "READY"
    assert 0 in params.values()
    with pytest.raises(TypeError, match="do not match"):
        query.params()
