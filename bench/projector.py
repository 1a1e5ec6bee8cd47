"""Phase 2: projector throughput on lifecycle events.

For N jobs still in CREATED, four events each — preprocessed (skipping
ready, staged_in), started (skipping leased), run_done, finished (skipping
postprocessed, staged_out) — appended wave by wave without CAS, pre-encoded.

* live: appended as fast as possible while the projector runs; its rate is
  measured from its committed position over time, and the lag to zero from
  the end of the appends.
* catch-up: appended with the projector stopped, then the projector started:
  its rate without the generator competing for the two cores.
* profile: a smaller live run with the projector under cProfile.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from bench.context import Bench
from bench.probe import CpuMeter, timeline
from bench.stack import BenchError, load_profile
from bench.stats import profile_summary
from bench.summary import row

JOBS = 25_000  # x 4 events = 100,000
PROFILED_JOBS = 10_000
PROJECTOR_TARGET_EVENTS_PER_S = 20_000
LAG_TARGET_S = 5.0


async def run(bench: Bench, workdir: Path, timeout_s: float) -> dict[str, Any]:
    jobs = bench.scaled(JOBS)
    live_result = await live(bench, jobs, timeout_s)
    catch_up_result = await catch_up(bench, jobs, timeout_s)
    profile = await profiled(
        bench, bench.scaled(PROFILED_JOBS), workdir / "projector.prof", timeout_s
    )
    return {
        "jobs": jobs,
        "events_per_job": 4,
        "live": live_result,
        "catch_up": catch_up_result,
        "profiled_live": profile,
        "summary": [
            row("projector, live", live_result["projector_events_per_s"], "events/s",
                at_least=PROJECTOR_TARGET_EVENTS_PER_S),
            row("projector, catch-up (no generator)", catch_up_result["projector_events_per_s"],
                "events/s", at_least=PROJECTOR_TARGET_EVENTS_PER_S),
            row("projector, live: while the generator appends",
                live_result["during_appends_events_per_s"], "events/s"),
            row("projector, live: the lag left when the appends end",
                live_result["after_appends_events_per_s"], "events/s"),
            row("lag to zero after appends end", live_result["lag_to_zero_s"], "s",
                at_most=LAG_TARGET_S, digits=2),
            row("append rate (publish_async, live)", live_result["append"]["events_per_s"],
                "events/s"),
        ],
    }  # fmt: skip


async def live(bench: Bench, jobs: int, timeout_s: float) -> dict[str, Any]:
    items = bench.events.lifecycle_waves(await bench.take_fresh_jobs(jobs, timeout_s))
    positions = bench.positions
    await positions.caught_up(timeout_s, "before the live projector run")
    start_seq = await positions.stream_last()
    meter = CpuMeter(bench.stack.pids()).start()
    async with asyncio.timeout(timeout_s), timeline(positions) as line:
        append_start = line.now()
        appended = await bench.appender.append(items, timeout_s)
        append_end = line.now()
        last = await positions.stream_last()
        lag_at_end = last - await positions.projector()
        await positions.wait_for(last, timeout_s, "projector catching up after the appends")
        zero_at = line.now()
        cpu = meter.stop()
    caught = line.reached(last) or zero_at
    first_move = line.first_advance(start_seq) or 0.0
    return {
        "events": len(items),
        "append": appended.to_json(),
        "lag_at_append_end_events": lag_at_end,
        "peak_lag_events": line.peak_lag(),
        "lag_to_zero_s": round(max(caught - append_end, 0.0), 3),
        "projector_events_per_s": round((last - start_seq) / max(caught - first_move, 1e-9)),
        "projector_peak_events_per_s": round(line.peak_rate()),
        # The sampler shares the generator's event loop and may see no move until the
        # appends end, which flatters the figure above; these two do not depend on it.
        "during_appends_events_per_s": round(
            (last - lag_at_end - start_seq) / max(append_end - append_start, 1e-9)
        ),
        "after_appends_events_per_s": round(lag_at_end / max(caught - append_end, 1e-9)),
        "cpu_pct": cpu,
        "quarantined_total": await quarantined(bench),
    }


async def catch_up(bench: Bench, jobs: int, timeout_s: float) -> dict[str, Any]:
    """Append with the projector stopped; time it from start until it reaches the end."""
    items = bench.events.lifecycle_waves(await bench.take_fresh_jobs(jobs, timeout_s))
    positions = bench.positions
    await positions.caught_up(timeout_s, "before the catch-up run")
    start_seq = await positions.stream_last()
    projector = bench.stack.service("projector")
    projector.stop()
    try:
        appended = await bench.appender.append(items, timeout_s)
    finally:
        started = time.perf_counter()
        projector.start()
    last = await positions.stream_last()
    result = await _measure_catch_up(bench, start_seq, last, started, timeout_s)
    result["append_without_projector"] = appended.to_json()
    result["quarantined_total"] = await quarantined(bench)
    return result


async def profiled(bench: Bench, jobs: int, out: Path, timeout_s: float) -> dict[str, Any]:
    """The live run again, smaller, with the projector under cProfile (rates not comparable)."""
    items = bench.events.lifecycle_waves(await bench.take_fresh_jobs(jobs, timeout_s))
    await bench.positions.caught_up(timeout_s, "before the profiled run")
    with bench.stack.profiled("projector", "lodestream.services.projector", out):
        started = time.perf_counter()
        appended = await bench.appender.append(items, timeout_s)
        await bench.positions.caught_up(timeout_s, "profiled projector catching up")
        seconds = time.perf_counter() - started
    stats = load_profile(out)
    return {
        "events": len(items),
        "append": appended.to_json(),
        "seconds_under_profiler": round(seconds, 3),
        "profile": profile_summary(stats) if stats else "cProfile wrote no output",
    }


async def _measure_catch_up(
    bench: Bench, start_seq: int, last: int, started: float, timeout_s: float
) -> dict[str, Any]:
    meter = CpuMeter(bench.stack.pids()).start()
    async with asyncio.timeout(timeout_s), timeline(bench.positions) as line:
        await bench.positions.wait_for(last, timeout_s, "projector catching up")
        done = line.now()
    cpu = meter.stop()
    first_move = line.first_advance(start_seq)
    if first_move is None:
        raise BenchError("the projector never moved")
    caught = line.reached(last) or done
    return {
        "events": last - start_seq,
        "startup_s": round(first_move - (started - line.started), 3),
        "seconds": round(caught - first_move, 3),
        "projector_events_per_s": round((last - start_seq) / max(caught - first_move, 1e-9)),
        "projector_peak_events_per_s": round(line.peak_rate()),
        "cpu_pct": cpu,
    }


async def quarantined(bench: Bench) -> int:
    cursor = await bench.positions.conn.execute("SELECT count(*) FROM rm.quarantine")
    row_ = await cursor.fetchone()
    return int(row_[0]) if row_ else 0
