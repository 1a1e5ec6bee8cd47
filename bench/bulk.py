"""Kill and reset thousands of jobs by filter: one request per job (how ``lode job kill
--site … --yes`` worked before issue 32) against one request per 5,000 (``POST /jobs/kill``,
``/jobs/reset``), on the embedded stack.

Each way acts on its own ``--jobs`` jobs (a tag of their own), freshly submitted and
projected; the time is from the first request to the last answer (the events appended),
as the user waits for it. Writes ``bench/out/bulk-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.report import machine_facts
from bench.stack import BenchError, BenchStack
from lodestream.client.config import ClientConfig
from lodestream.client.sdk import LodeClient

SITE = "bulk"
CHUNK = 5000


def submit(client: LodeClient, count: int, run: str) -> None:
    jobs = [{"site": SITE, "app": "sim", "workdir": f"{run}/{i}", "tags": {"run": run}}
            for i in range(count)]  # fmt: skip
    for start in range(0, count, CHUNK):
        client.submit_jobs(jobs[start : start + CHUNK], wait=True)


def one_by_one(client: LodeClient, run: str) -> tuple[float, int]:
    """As the CLI did: list the jobs the filter selects, then one kill request each."""
    started = time.perf_counter()
    ids = [job["id"] for job in client.list_jobs(tag=[f"run:{run}"])]
    for job_id in ids:
        client.kill_job(job_id)
    return time.perf_counter() - started, len(ids)


def in_bulk(client: LodeClient, run: str, verb: str) -> tuple[float, int, int]:
    """``POST /jobs/<verb>`` until it says there is no more; seconds, jobs, requests."""
    action = client.kill_jobs if verb == "kill" else client.reset_jobs
    started = time.perf_counter()
    acted = requests = 0
    while True:
        done = action(tags=[f"run:{run}"])
        acted, requests = acted + int(done["acted"]), requests + 1
        if not done["more"] or not done["acted"]:
            return time.perf_counter() - started, acted, requests


def measure(client: LodeClient, jobs: int) -> dict[str, Any]:
    client.register_site(SITE)
    submit(client, jobs, "one")
    submit(client, jobs, "bulk")
    seconds, count = one_by_one(client, "one")
    record: dict[str, Any] = {"jobs": jobs, "one_by_one": {"seconds": seconds, "jobs": count}}
    seconds, count, requests = in_bulk(client, "bulk", "kill")
    record["bulk_kill"] = {"seconds": seconds, "jobs": count, "requests": requests}
    time.sleep(2.0)  # reset is judged on the read model: let the projector apply the kills
    seconds, count, requests = in_bulk(client, "bulk", "reset")
    record["bulk_reset"] = {"seconds": seconds, "jobs": count, "requests": requests}
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=2500)
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="lode-bulk-"))
    root.chmod(0o711)  # Postgres runs as its own account when we are root
    stack = BenchStack(root)
    record: dict[str, Any] = {"date": datetime.now(UTC).isoformat(), "machine": machine_facts()}
    try:
        info = stack.start()
        with LodeClient(ClientConfig(info.api_url, info.token), timeout_s=300) as client:
            record["bulk"] = measure(client, args.jobs)
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    finally:
        stack.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"bulk-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    out.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(json.dumps(record["bulk"], indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
