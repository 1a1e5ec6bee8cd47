"""How far the projector has applied a stream: the one place that reads it and waits for it.

The projector commits its rows and its position (``rm.projector_position``) in one
transaction (:mod:`.store`), so whoever reads position N reads every row of the events up
to N as well. The API waits on it for read-your-writes, the controller so that what it
reads is never older than the event it reacts to, the tests and the bench to know the
read model has caught up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Final

import psycopg
from sqlalchemy import bindparam, select
from sqlalchemy.ext.asyncio import AsyncConnection

from lodestream.infra.postgres.compiled import Compiled
from lodestream.infra.postgres.tables import projector_position
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.services.projector.errors import ProjectorBehind

POSITION: Final = select(projector_position.c.seq).where(
    projector_position.c.stream == bindparam("stream")
)
_POSITION: Final = Compiled.of(POSITION)


async def applied_seq(
    conn: AsyncConnection | psycopg.AsyncConnection[Any], stream: str = EVENTS_STREAM
) -> int:
    """The last sequence of ``stream`` the projector has committed; 0 before its first batch.

    ``conn`` is the API's SQLAlchemy connection or the plain psycopg one of the others.
    """
    if isinstance(conn, AsyncConnection):
        seq = (await conn.execute(POSITION, {"stream": stream})).scalar_one_or_none()
    else:
        cursor = await conn.execute(_POSITION.sql, _POSITION.params(stream=stream))
        row = await cursor.fetchone()
        seq = row[0] if row else None
    return int(seq or 0)


async def wait_until_applied(
    read: Callable[[], Awaitable[int]], seq: int, *, timeout_s: float, poll_s: float
) -> int:
    """Poll ``read`` (e.g. :func:`applied_seq` on a connection) until it reaches ``seq``.

    Returns the position read; raises :class:`ProjectorBehind` once ``timeout_s`` has
    passed. A read in flight is never cancelled (cancelling a pooled connection's checkout
    can spoil the pool), so the wait may overrun by one read.
    """
    # Polling one row is cheaper here than LISTEN/NOTIFY plumbing, and as prompt at 5-50 ms.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        position = await read()
        if position >= seq:
            return position
        if loop.time() >= deadline:
            raise ProjectorBehind(seq, position, timeout_s)
        await asyncio.sleep(poll_s)
