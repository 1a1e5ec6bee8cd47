"""Phase 1: bulk submission through the API, then the projector's lag back to zero.

Bursts of 20 requests of 5,000 jobs (``POST /jobs?wait=false``), bodies
encoded before the clock starts; "lag to zero" is the time from the last 202
until the projector's position reaches the stream's end:

1. one client with the whole stack, controller included (it preprocesses
   every job, so the stream ends one event per job later);
2. one client, 3. two concurrent clients (10 requests each) — the issue's
   figures, controller stopped, projector live;
4. two clients with the projector paused: the API's own ceiling;
5. a few requests with the API under cProfile.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson

from bench.context import SITE, Bench
from bench.probe import CpuMeter, timeline
from bench.stack import BenchError, load_profile
from bench.stats import latency_ms, profile_summary
from bench.summary import row
from bench.workload import submit_body

REQUESTS = 20
JOBS_PER_REQUEST = 5_000
PROFILED_REQUESTS = 4
TARGET_JOBS_PER_S = 10_000
LAG_TARGET_S = 5.0


async def run(bench: Bench, workdir: Path, timeout_s: float) -> dict[str, Any]:
    per_request = bench.scaled(JOBS_PER_REQUEST)
    # First, while the log is short: the whole stack, the controller preprocessing every job.
    bench.stack.start_service("controller")
    try:
        controlled = await burst(
            bench, clients=1, per_request=per_request, timeout_s=timeout_s, controller=True
        )
    finally:
        bench.stack.stop_service("controller")
    one = await burst(bench, clients=1, per_request=per_request, timeout_s=timeout_s)
    two = await burst(bench, clients=2, per_request=per_request, timeout_s=timeout_s)
    # The API's own ceiling: the same burst with the projector paused (it catches up after).
    paused = await burst(
        bench, clients=2, per_request=per_request, timeout_s=timeout_s, pause_projector=True
    )
    profile = await profiled(bench, per_request, workdir / "api.prof", timeout_s)
    return {
        "jobs_per_request": per_request,
        "requests": REQUESTS,
        "one_client": one,
        "two_clients": two,
        "two_clients_projector_paused": paused,
        "one_client_with_controller": controlled,
        "api_profile": profile,
        "summary": [
            row("submit, 1 client", one["jobs_per_s"], "jobs/s", at_least=TARGET_JOBS_PER_S),
            row("submit, 2 clients", two["jobs_per_s"], "jobs/s", at_least=TARGET_JOBS_PER_S),
            row("request latency p50, 1 client", one["request_latency"]["p50_ms"], "ms"),
            row("lag to zero after burst, 1 client", one["lag_to_zero_s"], "s",
                at_most=LAG_TARGET_S, digits=2),
            row("lag to zero after burst, 2 clients", two["lag_to_zero_s"], "s",
                at_most=LAG_TARGET_S, digits=2),
            row("projector during submit burst", one["projector_events_per_s"], "events/s"),
            row("submit, 2 clients, projector paused (API alone)", paused["jobs_per_s"],
                "jobs/s"),
            row("with controller: submit, 1 client", controlled["jobs_per_s"], "jobs/s"),
            row("with controller: burst end until all jobs PREPROCESSED in the read model",
                controlled["lag_to_zero_s"], "s", digits=2),
        ],
    }  # fmt: skip


async def _post_all(
    bench: Bench, bodies: list[bytes], latencies: list[float], failures: list[str]
) -> list[str]:
    """POST ``bodies`` one after another; the ids of the accepted jobs."""
    ids: list[str] = []
    async with bench.http() as client:
        for body in bodies:
            started = time.perf_counter()
            response = await client.post("/jobs", params={"wait": "false"}, content=body)
            latencies.append(time.perf_counter() - started)
            if response.status_code != 202:
                failures.append(f"{response.status_code}: {response.text[:300]}")
                continue
            ids.extend(job["id"] for job in orjson.loads(response.content)["jobs"])
    return ids


async def burst(
    bench: Bench,
    *,
    clients: int,
    per_request: int,
    timeout_s: float,
    controller: bool = False,
    pause_projector: bool = False,
) -> dict[str, Any]:
    """POST 20 bodies from ``clients`` clients; then wait until the projector has caught up.

    With the controller running, "caught up" means its ``job.preprocessed`` for every job
    is projected too: the stream ends one event per job later than the burst's own events.
    With ``pause_projector`` the projector is stopped for the burst and started after it.
    """
    first = bench.take_indexes(REQUESTS * per_request)
    bodies = [submit_body(SITE, first + k * per_request, per_request) for k in range(REQUESTS)]
    shares = [bodies[c::clients] for c in range(clients)]
    positions = bench.positions
    await positions.caught_up(timeout_s, "before the submit burst")
    start_seq = await positions.stream_last()
    latencies: list[float] = []
    failures: list[str] = []
    if pause_projector:
        bench.stack.stop_service("projector")
    meter = CpuMeter(bench.stack.pids()).start()
    async with asyncio.timeout(timeout_s), timeline(positions) as line:
        try:
            accepted = await asyncio.gather(
                *(_post_all(bench, share, latencies, failures) for share in shares)
            )
        finally:
            burst_s = line.now()
            cpu = meter.stop()
            if pause_projector:
                bench.stack.start_service("projector")
        jobs = sum(len(ids) for ids in accepted)
        last = await positions.stream_last()
        if controller:
            last = max(last, start_seq + 2 * jobs)
        lag_at_end = last - await positions.projector()
        await positions.wait_for(last, timeout_s, "projector catching up after the burst")
        zero_at = line.now()
    if not jobs:
        raise BenchError(f"no job was accepted: {failures[:1]}")
    if not controller:  # still CREATED: the projector phase gives them a lifecycle
        for ids in accepted:
            bench.fresh_jobs.extend(ids)
    caught = line.reached(last) or zero_at
    first_move = line.first_advance(start_seq) or 0.0
    return {
        "clients": clients,
        "controller": controller,
        "projector_paused": pause_projector,
        "jobs": jobs,
        "failed_requests": len(failures),
        "first_failure": failures[0] if failures else None,
        "seconds": round(burst_s, 3),
        "jobs_per_s": round(jobs / burst_s),
        "request_latency": latency_ms(latencies),
        "stream_seqs": [start_seq + 1, last],
        "lag_at_burst_end_events": lag_at_end,
        "peak_lag_events": line.peak_lag(),
        "lag_to_zero_s": round(max(caught - burst_s, 0.0), 3),
        "projector_events_per_s": round((last - start_seq) / max(caught - first_move, 1e-9)),
        "projector_peak_events_per_s": round(line.peak_rate()),
        "cpu_pct_during_burst": cpu,
    }


async def profiled(bench: Bench, per_request: int, out: Path, timeout_s: float) -> dict[str, Any]:
    """A few requests against the API under cProfile (latencies not comparable)."""
    first = bench.take_indexes(PROFILED_REQUESTS * per_request)
    bodies = [
        submit_body(SITE, first + k * per_request, per_request) for k in range(PROFILED_REQUESTS)
    ]
    latencies: list[float] = []
    failures: list[str] = []
    with bench.stack.profiled("api", "lodestream.services.api", out):
        async with asyncio.timeout(timeout_s):
            bench.fresh_jobs.extend(await _post_all(bench, bodies, latencies, failures))
    stats = load_profile(out)
    await bench.positions.caught_up(timeout_s, "after the profiled submit")
    return {
        "requests": len(bodies),
        "failed_requests": len(failures),
        "request_latency_under_profiler": latency_ms(latencies),
        "profile": profile_summary(stats) if stats else "cProfile wrote no output",
    }
