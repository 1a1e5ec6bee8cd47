"""The bulk dataset: jobs appended straight to the log, with lifecycles so states vary."""

from __future__ import annotations

import time
from typing import Any

from bench.append import AppendStats
from bench.context import Bench

CHUNK_JOBS = 50_000


async def load_jobs(bench: Bench, count: int, timeout_s: float) -> dict[str, Any]:
    """Append ``count`` jobs (created, then their lifecycle waves) in chunks, pipelined."""
    generate_s = 0.0
    stats = AppendStats()
    deadline = time.monotonic() + timeout_s
    remaining = count
    started = time.perf_counter()
    while remaining > 0:
        n = min(CHUNK_JOBS, remaining)
        t = time.perf_counter()
        items = bench.events.dataset_chunk(bench.take_indexes(n), n)
        generate_s += time.perf_counter() - t
        stats.add(await bench.appender.append(items, max(deadline - time.monotonic(), 1.0)))
        remaining -= n
    return {
        "jobs": count,
        "wall_s": round(time.perf_counter() - started, 3),
        "generate_s": round(generate_s, 3),
        "append": stats.to_json(),
    }


async def jobs_in_read_model(bench: Bench) -> int:
    cursor = await bench.positions.conn.execute("SELECT count(*) FROM rm.jobs")
    row = await cursor.fetchone()
    return int(row[0]) if row else 0
