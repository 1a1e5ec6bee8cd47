"""Free nodes (queue, how long each stays free) folded into cumulative backfill windows."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable

from lodestream.platform_adapters.schedulers.base import BackfillWindow


def windows_from_free_nodes(free: Iterable[tuple[str, int | None]]) -> list[BackfillWindow]:
    """One window per queue and distinct length, each counting every node free at least as long.

    ``free`` holds one ``(queue, minutes)`` per free node and queue (None: no known limit). Nodes
    free for less than a minute cannot hold a job and are left out. Queues come in name order,
    the windows of a queue longest first, so ``[q 4 nodes 30 min, q 10 nodes 5 min]`` reads "4
    nodes for 30 minutes, or 10 for 5".
    """
    per_queue: defaultdict[str, Counter[int | None]] = defaultdict(Counter)
    for queue, minutes in free:
        if minutes is None or minutes >= 1:
            per_queue[queue][minutes] += 1
    windows: list[BackfillWindow] = []
    for queue in sorted(per_queue):
        counts = per_queue[queue]
        # None (no limit) is the longest of all.
        lengths = sorted(counts, key=lambda m: (m is not None, -(m or 0)))
        total = 0
        for minutes in lengths:
            total += counts[minutes]
            windows.append(BackfillWindow(queue=queue, nodes=total, minutes=minutes))
    return windows
