"""Read-your-writes: wait until the projector has applied a stream sequence."""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy.ext.asyncio import AsyncEngine

from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.services.api.errors import InvalidInput, NotYetProjected
from lodestream.services.projector.errors import ProjectorBehind
from lodestream.services.projector.position import applied_seq, wait_until_applied

POLL_S: Final = 0.01


def wait_budget(requested: float | None, maximum: float) -> float:
    if requested is None:
        return maximum
    if requested > maximum:
        raise InvalidInput(f"wait_timeout must be at most {maximum:g} s, got {requested:g}")
    return requested


async def until_projected(
    engine: AsyncEngine, seq: int, timeout_s: float, accepted: Any, stream: str = EVENTS_STREAM
) -> None:
    """Return once ``stream`` is applied up to ``seq``; else NotYetProjected with ``accepted``."""

    async def read() -> int:
        # A connection per poll: a waiting request must not pin a pool slot for seconds.
        async with engine.connect() as conn:
            return await applied_seq(conn, stream)

    try:
        await wait_until_applied(read, seq, timeout_s=timeout_s, poll_s=POLL_S)
    except ProjectorBehind as exc:
        raise NotYetProjected(
            f"appended up to sequence {seq}, but the projector has only applied {exc.position} "
            f"after {timeout_s:g} s; the result is accepted and will appear in reads shortly",
            accepted,
        ) from exc
