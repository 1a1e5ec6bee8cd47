"""Issue 16's comparison: the same no-op jobs on the 3-node cluster (R3) and on one server.

    make bench-cluster        (LODE_CLUSTER_BENCH=1; root and Docker, like the fault tests)

One run measures both, in turn, with the same host processes (projector, controller, site
agent, one pilot), the same Postgres container (a database each) and the same workload:
``JOBS`` jobs of ``sleep 0`` appended in batches, from the first append to the last
JOB_FINISHED in the read model; then ``LATENCY_JOBS`` jobs one at a time on the idle pilot,
submit → RUNNING from the log's own times. Only NATS differs: three nodes in containers
with every append replicated three times, or the single server the embedded stack runs.
Figures are printed and written to ``bench/out/cluster-<time>.json``; nothing is asserted
of them (the tests never assert a timing), only that every job finished once.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import psycopg
import pytest

from lodestream.eventlog import EventLog
from lodestream.eventlog.append import Appended
from lodestream.infra.postgres.migrate import upgrade
from lodestream.schemas.events.job import CreatedData, JobCreated
from lodestream.schemas.states import CREATED_RUNNABLE
from tests.chaos.verify import read_log
from tests.containers.hostside import OWNER, SITE, Run, Target, running
from tests.fixtures.containers import ContainerCluster, PostgresContainer
from tests.fixtures.nats import SecureNats

pytestmark = [
    pytest.mark.slow,
    pytest.mark.alone,  # a benchmark: nothing else runs meanwhile
    pytest.mark.skipif(
        os.environ.get("LODE_CLUSTER_BENCH") != "1",
        reason="a benchmark: set LODE_CLUSTER_BENCH=1 (make bench-cluster)",
    ),
]
JOBS: Final = int(os.environ.get("LODE_CLUSTER_BENCH_JOBS", "5000"))
LATENCY_JOBS: Final = 50
BATCH: Final = 500
# One pilot with room for every job at once, fetching many: the pilot is not what is compared.
PILOT: Final = {"virtual_nodes": 1, "cores_per_node": 64, "max_fetch": 512}
HEARTBEAT_TTL_S: Final = 10


async def finished(dsn: str, ids: list[uuid.UUID]) -> int:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT count(*) FROM rm.jobs WHERE state = 'JOB_FINISHED' AND id = ANY(%s)", (ids,)
        )
        row = await cursor.fetchone()
    return int(row[0]) if row else 0


async def until_finished(dsn: str, ids: list[uuid.UUID], poll_s: float) -> None:
    async with asyncio.timeout(900):
        while await finished(dsn, ids) < len(ids):
            await asyncio.sleep(poll_s)


def noop(tag: str, i: int) -> JobCreated:
    # Created runnable, as the API creates a job of an app with no hook and no staging.
    # 64 to a node, as bench.lifecycle's: without it each job took the pilot's one node
    # alone and the jobs ran one at a time, whatever NATS did.
    data = CreatedData(site=SITE, app="sleeper", workdir=f"{tag}/{i}",
                       parameters={"seconds": "0"}, node_packing_count=64,
                       skipped=CREATED_RUNNABLE)  # fmt: skip
    return JobCreated.create(site=SITE, aggregate_id=uuid.uuid4(), actor=f"user:{OWNER}",
                             data=data)  # fmt: skip


async def throughput(run: Run, n: int) -> dict[str, float]:
    jobs = [noop("throughput", i) for i in range(n)]
    log = EventLog(run.js)
    began = time.monotonic()
    for start in range(0, len(jobs), BATCH):
        outcomes = await log.append_many([(job, 0) for job in jobs[start : start + BATCH]])
        assert all(isinstance(o, Appended) for o in outcomes), outcomes
    appended_s = time.monotonic() - began
    await until_finished(run.dsn, [job.aggregate_id for job in jobs], poll_s=0.1)
    elapsed = time.monotonic() - began
    return {"jobs": n, "seconds": round(elapsed, 2), "jobs_per_s": round(n / elapsed, 1),
            "append_jobs_per_s": round(n / appended_s, 1)}  # fmt: skip


async def latency(run: Run, n: int) -> dict[str, float]:
    """Submit → RUNNING (job.created → job.started, the producers' clocks on this host)."""
    jobs = []
    log = EventLog(run.js)
    for i in range(n):
        job = noop("latency", i)  # made now: its occurred_at is when it is submitted
        jobs.append(job)
        await log.append(job, expect=0)
        await until_finished(run.dsn, [job.aggregate_id], poll_s=0.01)
    events = await read_log(run.js)
    gaps = []
    for job in jobs:
        times = {e.event.type: e.event.occurred_at for e in events.jobs[job.aggregate_id]}
        gaps.append((times["job.started"] - times["job.created"]).total_seconds() * 1000)
    gaps.sort()
    return {"jobs": n, "p50_ms": round(statistics.median(gaps), 2),
            "p95_ms": round(gaps[int(0.95 * (len(gaps) - 1))], 2)}  # fmt: skip


async def measure(target: Target, tmp_path: Path) -> dict[str, Any]:
    async with running(target, None, tmp_path, heartbeat_ttl_s=HEARTBEAT_TTL_S,
                       launcher=PILOT) as run:  # fmt: skip
        figures = {"throughput": await throughput(run, JOBS),
                   "latency": await latency(run, LATENCY_JOBS)}  # fmt: skip
        assert not run.host.exited()
    return figures


def second_database(postgres: PostgresContainer, name: str) -> str:
    """A database of its own in the same server, migrated: the runs share the server only."""
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = postgres.url.rsplit("/", 1)[0] + f"/{name}"
    upgrade(url)
    return url


@pytest.mark.timeout(3600)
async def test_cluster_against_one_server(
    nats_cluster: ContainerCluster,
    postgres_container: PostgresContainer,
    secure_nats: SecureNats,
    tmp_path: Path,
) -> None:
    single = Target(
        secure_nats.settings(), secure_nats.server.websocket_url, secure_nats.ca_file,
        secure_nats.seed_files[SITE], await asyncio.to_thread(
            second_database, postgres_container, "lodestream_single"),
    )  # fmt: skip
    record = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "cluster (3 nodes, R3)": await measure(
            Target.of_cluster(nats_cluster, postgres_container), tmp_path / "cluster"
        ),
        "one server": await measure(single, tmp_path / "single"),
    }
    print(keep(record))


def keep(record: dict[str, Any]) -> str:
    """Write ``record`` to bench/out/cluster-<time>.json; its text."""
    text = json.dumps(record, indent=2)
    out = Path("bench/out")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"cluster-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json").write_text(text + "\n")
    return text
