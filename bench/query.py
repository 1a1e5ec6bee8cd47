"""Phase 4: ``GET /jobs`` latency on a read model of 1,000,000 jobs.

Each query shape is requested 200 times (after a warm-up) by one keep-alive
client; latency is client-side (HTTP, the API, SQL and JSON). The same
shapes are then run through the API's own query code (``queries.list_jobs``)
straight against Postgres, which splits API overhead from SQL time, and the
statements it issues for the slowest shape are shown with
``EXPLAIN (ANALYZE, BUFFERS)``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Final

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from bench.context import Bench
from bench.dataset import jobs_in_read_model, load_jobs
from bench.stack import BenchError, load_profile
from bench.stats import latency_ms, percentile, profile_summary
from bench.summary import row
from lodestream.infra.postgres.migrate import sqlalchemy_url
from lodestream.services.api import queries

TARGET_JOBS = 1_000_000
REQUESTS = 200
WARMUP = 20
SQL_REPS = 50
PROFILED_REQUESTS = 100
SHAPE_BUDGET_S = 90.0
PAGE = 100
P50_TARGET_MS = 20.0

Params = dict[str, str | list[str]]
SHAPES: Final[dict[str, Params]] = {
    "state+tag": {"state": "RUNNING", "tag": "shard:17"},
    "state+tag, order_by=-updated": {"state": "RUNNING", "tag": "shard:17", "order_by": "-updated"},
    "state+tag (campaign)": {"state": "JOB_FINISHED", "tag": "campaign:c3"},
    "state+tag (campaign), order_by=created": {
        "state": "JOB_FINISHED", "tag": "campaign:c3", "order_by": "created"
    },
    "state+2 tags (rare)": {"state": "CREATED", "tag": ["shard:17", "campaign:c3"]},
    "state only": {"state": "PREPROCESSED"},
    "state only, order_by=-updated": {"state": "PREPROCESSED", "order_by": "-updated"},
    "tag only": {"tag": "shard:17"},
    "tag only, order_by=-updated": {"tag": "campaign:c3", "order_by": "-updated"},
    "no filter": {},
}  # fmt: skip


async def run(bench: Bench, workdir: Path, timeout_s: float) -> dict[str, Any]:
    target = bench.scaled(TARGET_JOBS)
    prepared = await _ensure_jobs(bench, target, timeout_s)
    model = await read_model_facts(bench)
    http = {name: await http_latency(bench, params) for name, params in SHAPES.items()}
    engine = create_async_engine(
        sqlalchemy_url(bench.stack.info.database_url), isolation_level="AUTOCOMMIT"
    )
    try:
        sql = {name: await sql_latency(engine, bench.owner, p) for name, p in SHAPES.items()}
        slowest = max(http, key=lambda name: http[name]["p50_ms"])
        plans = {name: await explain(engine, bench.owner, p) for name, p in SHAPES.items()}
    finally:
        await engine.dispose()
    profile = await profiled(bench, SHAPES[slowest], workdir / "api-query.prof")
    shapes = {
        name: {"params": SHAPES[name], "http": http[name], "sql": sql[name], "plan": plans[name]}
        for name in SHAPES
    }
    return {
        "dataset": prepared,
        "read_model": model,
        "shapes": shapes,
        "slowest_shape": slowest,
        "api_profile_of_slowest_shape": profile,
        "summary": [
            row(f"GET /jobs {name}: p50 / p95 / p99 {h['p95_ms']:.1f} / {h['p99_ms']:.1f} ms",
                h["p50_ms"], "ms", at_most=P50_TARGET_MS, digits=1)
            for name, h in http.items()
        ],
    }  # fmt: skip


async def _ensure_jobs(bench: Bench, target: int, timeout_s: float) -> dict[str, Any]:
    """Top the read model up to ``target`` jobs through the live projector, if it is short."""
    have = await jobs_in_read_model(bench)
    result: dict[str, Any] = {"jobs_before": have}
    if have < target:
        result["load"] = await load_jobs(bench, target - have, timeout_s)
        await bench.positions.caught_up(timeout_s, "projecting the query dataset")
    return result


async def read_model_facts(bench: Bench) -> dict[str, Any]:
    """Row counts by state, sizes, and whether ``rm.jobs`` had planner statistics."""
    conn = bench.positions.conn
    cursor = await conn.execute(
        "SELECT last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL, n_live_tup "
        "FROM pg_stat_user_tables WHERE schemaname = 'rm' AND relname = 'jobs'"
    )
    stat = await cursor.fetchone()
    analyzed = bool(stat and stat[0])
    facts: dict[str, Any] = {"had_statistics": analyzed}
    if not analyzed:  # autovacuum would get there within minutes; we measure the steady state
        started = time.perf_counter()
        await conn.execute("ANALYZE rm.jobs")
        facts["analyze_s"] = round(time.perf_counter() - started, 2)
    cursor = await conn.execute("SELECT state, count(*) FROM rm.jobs GROUP BY state ORDER BY 1")
    facts["jobs_by_state"] = dict(await cursor.fetchall())
    cursor = await conn.execute(
        "SELECT c.relname, pg_relation_size(c.oid) / 1048576 FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'rm' AND c.relkind IN ('r', 'i') ORDER BY 2 DESC LIMIT 12"
    )
    facts["relation_mb"] = {name: int(mb) for name, mb in await cursor.fetchall()}
    return facts


async def profiled(bench: Bench, params: Params, out: Path) -> dict[str, Any]:
    """The API under cProfile while it answers ``params`` (latencies not comparable)."""
    with bench.stack.profiled("api", "lodestream.services.api", out):
        latency = await http_latency(bench, params, requests=PROFILED_REQUESTS)
    stats = load_profile(out)
    return {
        "params": params,
        "latency_under_profiler": latency,
        "profile": profile_summary(stats) if stats else "cProfile wrote no output",
    }


async def http_latency(bench: Bench, params: Params, requests: int = REQUESTS) -> dict[str, Any]:
    latencies: list[float] = []
    items = 0
    deadline = time.monotonic() + SHAPE_BUDGET_S
    async with bench.http() as client:
        for i in range(WARMUP + requests):
            if time.monotonic() > deadline:  # a very slow shape reports fewer samples (n)
                break
            started = time.perf_counter()
            response = await client.get("/jobs", params={**params, "limit": str(PAGE)})
            elapsed = time.perf_counter() - started
            if response.status_code != 200:
                raise BenchError(
                    f"GET /jobs {params}: {response.status_code} {response.text[:300]}"
                )
            if i >= WARMUP:
                latencies.append(elapsed)
            items = len(response.json()["items"])
    return {**latency_ms(latencies), "items": items}


def _filter(params: Params) -> tuple[queries.JobFilter, queries.OrderBy]:
    state, tag = params.get("state"), params.get("tag", [])
    tags = dict(t.split(":", 1) for t in ([tag] if isinstance(tag, str) else tag))
    order = str(params.get("order_by", "-created"))
    assert order in ("created", "-created", "updated", "-updated")
    return queries.JobFilter(states=(state,) if isinstance(state, str) else (), tags=tags), order  # type: ignore[return-value]


async def _list(conn: AsyncConnection, owner: str, params: Params) -> int:
    job_filter, order = _filter(params)
    # The route asks for one row more than the page, to tell whether there is a next page.
    rows = await queries.list_jobs(
        conn, owner, job_filter, order_by=order, limit=PAGE + 1, offset=0
    )
    return len(rows)


async def sql_latency(engine: AsyncEngine, owner: str, params: Params) -> dict[str, Any]:
    """The API's query code alone (no HTTP, no response model), same connection pool settings."""
    latencies: list[float] = []
    async with engine.connect() as conn:
        for i in range(5 + SQL_REPS):
            started = time.perf_counter()
            await _list(conn, owner, params)
            if i >= 5:
                latencies.append(time.perf_counter() - started)
    return {"p50_ms": round(percentile(latencies, 50) * 1000, 2), "n": len(latencies)}


async def explain(engine: AsyncEngine, owner: str, params: Params) -> list[dict[str, Any]]:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of each statement ``list_jobs`` issues for ``params``."""
    issued: list[tuple[str, Any]] = []

    def capture(_c: Any, _cur: Any, statement: str, parameters: Any, *_: Any) -> None:
        if not statement.lstrip().upper().startswith("EXPLAIN"):
            issued.append((statement, parameters))

    event.listen(engine.sync_engine, "before_cursor_execute", capture)
    try:
        async with engine.connect() as conn:
            await _list(conn, owner, params)
            statements = list(issued)
            plans = []
            for statement, parameters in statements:
                result = await conn.exec_driver_sql(
                    "EXPLAIN (ANALYZE, BUFFERS) " + statement, parameters
                )
                plans.append(
                    {
                        "sql": " ".join(statement.split()),
                        "parameters": {k: str(v) for k, v in dict(parameters or {}).items()},
                        "plan": [line for (line,) in result],
                    }
                )
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", capture)
    return plans
