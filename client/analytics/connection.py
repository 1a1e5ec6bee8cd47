"""The control-plane connection an analysis reads ``EVENTS`` with, opened as the CLI and each
process of a split replay open it: a bounded wait, few reconnects, and a :class:`SourceError`
that says why it failed (the server's own words, e.g. an authorization violation).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

from nats.aio.client import Client
from nats.errors import Error as NatsError

from lodestream.client.analytics.errors import SourceError
from lodestream.settings import NatsSettings

CONNECT_TIMEOUT_S: Final = 10.0
RECONNECTS: Final = 2  # an analysis reads for a while; it gives up rather than wait for ever


@asynccontextmanager
async def control_connection(settings: NatsSettings) -> AsyncIterator[Client]:
    """A connection with ``settings``, closed on the way out."""
    from lodestream.natsconn import connect  # noqa: PLC0415 - nats-py's machinery, when used

    reported: list[Exception] = []
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            nc = await connect(settings, on_error=reported.append,
                               max_reconnect_attempts=RECONNECTS)  # fmt: skip
    except (TimeoutError, OSError, NatsError) as exc:
        why = reported[-1] if reported else exc  # "no servers" says less than what they said
        raise SourceError(f"cannot connect to NATS at {settings.url}: {why}") from exc
    try:
        yield nc
    finally:
        await nc.close()
