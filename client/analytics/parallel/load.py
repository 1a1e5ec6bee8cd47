"""A replay of ``EVENTS`` split across processes by aggregate: :func:`load_stream_parallel`.

One Python process folds ~25,000 events a second at best (decode, the shared rule, the fold,
all on one core), so a long log is split: each process reads the whole range and replays
only the jobs, sessions and batch jobs of its share (:mod:`.partition`), and the parent
merges the parts (:mod:`.merge`) into what one replay of the range gives.
"""

from __future__ import annotations

import os
from typing import Final

from nats.aio.client import Client

from lodestream.client.analytics.intake import log_refusal
from lodestream.client.analytics.load import load_stream
from lodestream.client.analytics.parallel.merge import merge_parts
from lodestream.client.analytics.parallel.pool import run_shares
from lodestream.client.analytics.parallel.worker import ShareTask
from lodestream.client.analytics.replay import Replay
from lodestream.client.analytics.selection import Selection
from lodestream.client.analytics.stream import stream_span
from lodestream.client.analytics.summary import Loaded
from lodestream.collector import collector_paused
from lodestream.settings import NatsSettings

# Each process reads the whole range (the client parses every message, the server sends
# every message once per process) and the parent unpickles every share's timelines, so a
# split pays for itself only with cores to spare. Measured on a 2-core machine over
# 1,000,000 events (bench.analytics; idle but for the bench): two processes replayed in
# 31-34 s against 34-36 s for one, both cores then busy with the two readers and
# nats-server; with other work on the machine it swung from a win (31 s against 39 s) to a
# loss (52-65 s against 36-44 s). So by default a 2-core machine replays in one process;
# with more cores, one process per core up to 4 (each more adds a full read of the range).
DEFAULT_WORKERS: Final = 4
SPLIT_FROM_CORES: Final = 3
# Starting processes and sending timelines back costs about a second: over 100,000 events
# two processes took 4.4 s against 3.8 s for one, over 1,000,000 about 3 s less; the
# crossover is near 250,000.
SPLIT_FROM: Final = 250_000


def usable_workers(asked: int) -> int:
    """``asked`` processes, but no more than the machine has cores, and at least one."""
    return max(1, min(asked, os.cpu_count() or 1))


def default_workers() -> int:
    """How many processes replay a long range when the caller does not say."""
    cores = os.cpu_count() or 1
    return usable_workers(DEFAULT_WORKERS) if cores >= SPLIT_FROM_CORES else 1


async def load_stream_parallel(
    nc: Client,
    settings: NatsSettings,
    selection: Selection | None = None,
    *,
    workers: int | None = None,
) -> Loaded:
    """The selection of ``EVENTS``, replayed by ``workers`` processes (at most one per core).

    ``nc`` is the control-plane connection the parent finds the range with; each process
    connects with ``settings`` (the same server and credential). ``workers`` None:
    :func:`default_workers` for a range of :data:`SPLIT_FROM` messages or more, else one.
    With one, this is :func:`~lodestream.client.analytics.load.load_stream` on ``nc``.
    """
    selection = selection or Selection()
    if workers is not None and usable_workers(workers) == 1:
        return await load_stream(nc, selection)
    span = await stream_span(nc, selection)
    if span is None:
        return Replay(selection).loaded()
    shares = default_workers() if workers is None else usable_workers(workers)
    if shares == 1 or (workers is None and span.messages < SPLIT_FROM):
        return await load_stream(nc, selection)
    return await _split(settings, selection, span.last, shares)


async def load_stream_shares(
    nc: Client, settings: NatsSettings, selection: Selection | None = None, *, shares: int
) -> Loaded:
    """The selection of ``EVENTS`` replayed in ``shares`` processes, however many cores
    there are (:func:`load_stream_parallel` is what to call; this is for tests)."""
    if shares < 1:
        raise ValueError(f"a replay needs at least one share, got {shares}")
    selection = selection or Selection()
    span = await stream_span(nc, selection)
    if span is None:
        return Replay(selection).loaded()
    return await _split(settings, selection, span.last, shares)


async def _split(settings: NatsSettings, selection: Selection, last: int, shares: int) -> Loaded:
    # The range ends where it ended for the parent: every share reads the same messages.
    tasks = [ShareTask(settings, selection, last, share, shares) for share in range(shares)]
    with collector_paused():  # unpickling the parts builds as much as the replay did
        loaded = merge_parts(await run_shares(tasks), selection)
    for refusal in loaded.intake.listed:  # the shares were told not to: what one replay logs
        log_refusal(refusal)
    return loaded
