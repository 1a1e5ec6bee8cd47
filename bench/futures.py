"""Futures resolved per second: ``LodeExecutor`` against the same jobs polled by hand.

    python -m bench.futures [--jobs 2000] [--rounds 2] [--out bench/out]

Starts the lifecycle bench's stack (api, projector, controller, a local site with its agent,
one pilot of 64 slots) and, alternately in one sitting, runs ``--jobs`` ``/bin/true`` jobs

* through one ``LodeExecutor`` (batched submission, every future settled from the one push
  feed), timed from the first ``submit`` to the last future settled; and
* submitted in the same batches and waited for the way a script without futures does, by
  counting the tag's JOB_FINISHED jobs through the API until all are there.

Also the settle lag of each future: when ``result()`` returned against the job's
``job.finished`` ``occurred_at`` on the log (the pilot's clock, on this machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from concurrent.futures import as_completed
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.lifecycle import SITE, LifecycleBench, quantiles
from lodestream.client.config import ClientConfig
from lodestream.client.sdk import LodeClient, LodeExecutor, LodeFuture

BATCH = 1000


def with_executor(client: LodeClient, jobs: int) -> dict[str, Any]:
    settled: dict[str, float] = {}
    start = time.monotonic()
    with LodeExecutor(client, site=SITE, batch_size=BATCH) as lode:
        futures = {lode.submit("noop"): i for i in range(jobs)}
        for done in as_completed(futures):
            done.result()
            settled[str(_job_id(done))] = time.time()
    elapsed = time.monotonic() - start
    lags = [settled[j] - finished for j, finished in _finished_at(client, list(settled)).items()]
    return {"jobs": jobs, "seconds": elapsed, "jobs_per_s": jobs / elapsed,
            "settle_lag_s": quantiles(lags)}  # fmt: skip


def _job_id(future: object) -> str | None:
    return future.job_id if isinstance(future, LodeFuture) else None


def by_polling(client: LodeClient, jobs: int) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:12]
    start = time.monotonic()
    for first in range(0, jobs, BATCH):
        batch = [
            {"site": SITE, "app": "noop", "workdir": f"poll/{tag}/{i}", "tags": {"bench": tag}}
            for i in range(first, min(jobs, first + BATCH))
        ]
        client.submit_jobs(batch)
    while sum(1 for _ in client.list_jobs(tag=[f"bench:{tag}"], state=["JOB_FINISHED"])) < jobs:
        time.sleep(0.05)
    elapsed = time.monotonic() - start
    return {"jobs": jobs, "seconds": elapsed, "jobs_per_s": jobs / elapsed}


def _finished_at(client: LodeClient, job_ids: list[str]) -> dict[str, float]:
    """Each job's ``job.finished`` time on the log, from a sample of 200 (one request each)."""
    out: dict[str, float] = {}
    for job_id in job_ids[:: max(1, len(job_ids) // 200)]:
        for event in client.job_events(job_id):
            if event["type"] == "job.finished":
                out[job_id] = datetime.fromisoformat(event["occurred_at"]).timestamp()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="lode-futures-"))
    root.chmod(0o711)  # Postgres runs as its own account when we are root
    bench = LifecycleBench(root)
    results: dict[str, Any] = {"date": datetime.now(UTC).isoformat(), "cpus": os.cpu_count(),
                               "executor": [], "polling": []}  # fmt: skip
    try:
        info = bench.start()
        bench.start_pilot("pilot-1")
        client = LodeClient(ClientConfig(api_url=info.api_url, token=info.token))
        by_polling(client, min(200, args.jobs))  # warm up: the pilot's first jobs, caches
        for _ in range(args.rounds):
            results["executor"].append(with_executor(client, args.jobs))
            results["polling"].append(by_polling(client, args.jobs))
            print(json.dumps({k: v[-1] for k, v in results.items() if isinstance(v, list)},
                             indent=2), flush=True)  # fmt: skip
        executor = statistics.median(r["jobs_per_s"] for r in results["executor"])
        polling = statistics.median(r["jobs_per_s"] for r in results["polling"])
        results["ratio_executor_to_polling"] = executor / polling
        print(f"executor {executor:.0f} jobs/s, polling {polling:.0f} jobs/s, "
              f"ratio {executor / polling:.2f}")  # fmt: skip
    finally:
        bench.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"futures-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
