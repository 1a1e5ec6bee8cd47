"""A replay of ``EVENTS`` split across processes by aggregate: :func:`load_stream_parallel`.

One Python process folds ~25,000 events a second at best (decode, the shared rule, the fold,
all on one core), so a long log is split: this process reads the range once, as the wire
gives it, and hands each process the messages of its share (:mod:`.partition`) to parse,
check and fold; it merges their parts (:mod:`.merge`) into what one replay of the range
gives. The server sends every message once, and no process parses another's messages.
"""

from __future__ import annotations

import asyncio

from nats.aio.client import Client

from lodestream.client.analytics.intake import log_refusal
from lodestream.client.analytics.load import load_stream
from lodestream.client.analytics.parallel.merge import merge_parts
from lodestream.client.analytics.parallel.partition import split_wires
from lodestream.client.analytics.parallel.pool import Shares
from lodestream.client.analytics.parallel.worker import ShareTask
from lodestream.client.analytics.replay import Replay
from lodestream.client.analytics.selection import Selection
from lodestream.client.analytics.stream import range_wires, stream_span
from lodestream.client.analytics.summary import Loaded
from lodestream.collector import collector_paused
from lodestream.shares import default_workers, send_all, usable_workers


async def load_stream_parallel(
    nc: Client, selection: Selection | None = None, *, workers: int | None = None
) -> Loaded:
    """The selection of ``EVENTS``, replayed by ``workers`` processes (at most one per core).

    ``nc`` is the control-plane connection the range is read on, once, by this process.
    ``workers`` None: :func:`~lodestream.shares.default_workers` for the range's length.
    With one, this is :func:`~lodestream.client.analytics.load.load_stream`.
    """
    selection = selection or Selection()
    if workers is not None and usable_workers(workers) == 1:
        return await load_stream(nc, selection)
    span = await stream_span(nc, selection)
    if span is None:
        return Replay(selection).loaded()
    shares = default_workers(span.messages) if workers is None else usable_workers(workers)
    if shares == 1:
        return await load_stream(nc, selection)
    return await replay_range(nc, selection, span.last, shares)


async def load_stream_shares(
    nc: Client, selection: Selection | None = None, *, shares: int
) -> Loaded:
    """The selection of ``EVENTS`` replayed in ``shares`` processes, however many cores
    there are (:func:`load_stream_parallel` is what to call; this is for tests)."""
    if shares < 1:
        raise ValueError(f"a replay needs at least one share, got {shares}")
    selection = selection or Selection()
    span = await stream_span(nc, selection)
    if span is None:
        return Replay(selection).loaded()
    return await replay_range(nc, selection, span.last, shares)


async def replay_range(nc: Client, selection: Selection, last: int, shares: int) -> Loaded:
    """The selection of ``EVENTS`` up to sequence ``last``, read here and replayed in
    ``shares`` processes. Whatever ends it (an error here or in a process, a process that
    died, the caller cancelling), no process outlives the call."""
    pool = Shares([ShareTask(selection, last, share, shares) for share in range(shares)])
    try:
        pool.start()
        async for wires in range_wires(nc, selection, last):
            await send_all(pool, split_wires(wires, shares))
        await asyncio.to_thread(pool.finish)
        with collector_paused():  # unpickling the parts builds as much as the replay did
            loaded = merge_parts(await asyncio.to_thread(pool.collect), selection)
    finally:
        pool.stop()
    for refusal in loaded.intake.listed:  # the shares were told not to: what one replay logs
        log_refusal(refusal)
    return loaded
