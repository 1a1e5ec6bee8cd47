"""Issue-30 benchmark: one large ``site: "auto"`` request over three sites of unequal speed.

    python -m bench.routing [--jobs 60] [--seconds 0.3,1,3] [--slots 2] [--strategy fastest_eta]

Starts an embedded stack and three local sites (``fast``, ``mid``, ``slow``), each with its
agent and one pilot of the same slots, whose app ``work`` sleeps 0.3, 1 and 3 s per job. A
warm-up of one wave per site (submitted to each by name) gives every site run times and
recent finishes to be judged on. Then one request of ``--jobs`` jobs goes to ``site: auto``
with ``--strategy``, and the bench reports:

* the split (jobs per site) and the makespan (submission → the last JOB_FINISHED visible in
  the read model);
* the best static split and its makespan, computed: a site with ``s`` slots that runs a job
  in ``t`` seconds finishes its ``n`` jobs at ``ceil(n / s) * t``; the split minimising the
  largest of these, with ``t`` the median run time each site showed in the warm-up (and with
  the nominal sleep times, for reference). Target: makespan ≤ 1.3 x the best static one.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg

from bench.stack import free_ports
from lodestream.agents.site.directory import init_site_dir
from lodestream.services.embedded import EmbeddedStack, StackInfo
from lodestream.services.embedded.process import ServiceProcess

SITES = ("fast", "mid", "slow")
APP = """
from lodestream.agents.site.apps import ApplicationDefinition


class Work(ApplicationDefinition):
    name = "work"
    command_template = "sleep {seconds}"
"""
HEARTBEAT_TTL_S = 10
TARGET_RATIO = 1.3


def best_static(jobs: int, run_s: dict[str, float], slots: dict[str, int]) -> dict[str, Any]:
    """The split of ``jobs`` identical jobs that finishes soonest, and when: each job in turn
    to the site where it would end first (optimal for identical jobs on such sites)."""
    split = dict.fromkeys(run_s, 0)
    ends = [(run_s[site], site) for site in sorted(run_s)]
    heapq.heapify(ends)
    makespan = 0.0
    for _ in range(jobs):
        end, site = heapq.heappop(ends)
        split[site] += 1
        makespan = max(makespan, end)
        heapq.heappush(ends, (math.ceil((split[site] + 1) / slots[site]) * run_s[site], site))
    return {"split": split, "makespan_s": round(makespan, 3)}


class RoutingBench:
    def __init__(self, root: Path, seconds: dict[str, float], slots: int) -> None:
        self.root = root
        self.seconds = seconds
        self.slots = slots
        self.stack = EmbeddedStack(root / "state", free_ports())
        self.info: StackInfo | None = None
        self.processes: list[ServiceProcess] = []

    def start(self) -> None:
        self.info = self.stack.start("bench")
        cli = [sys.executable, "-m", "lodestream.client.cli.main"]
        for site in SITES:
            directory = self.root / site
            public_key = init_site_dir(
                directory, site, nats_url=self.info.websocket_url, ca_file=self.info.ca_file,
                api_url=self.info.api_url, examples=False,
                launcher={"idle_ttl_s": 3600, "heartbeat_ttl_s": HEARTBEAT_TTL_S,
                          "virtual_nodes": 1, "cores_per_node": self.slots},
            )  # fmt: skip
            (directory / "apps" / "work.py").write_text(
                APP.replace("{seconds}", str(self.seconds[site]))
            )
            with self.http() as http:
                response = http.post("/sites", params={"wait": True},
                                     json={"name": site, "public_key": public_key})  # fmt: skip
                response.raise_for_status()
            self.stack.supervise_once()
            self._spawn(f"agent-{site}", [*cli, "site", "start", str(directory)])
        for site in SITES:
            self._wait_for_app(site)
            self._spawn(f"pilot-{site}", [*cli, "launcher", "--site", str(self.root / site),
                                          "--wall-time-min", "600"])  # fmt: skip
        deadline = time.monotonic() + 120
        while self._scalar("SELECT count(*) FROM rm.sessions WHERE state = 'open'") < len(SITES):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the pilots did not all open their sessions; see {self.root}")
            time.sleep(0.1)

    def _spawn(self, name: str, argv: list[str]) -> None:
        process = ServiceProcess(name, argv, {}, self.root / f"{name}.log")
        process.start()
        self.processes.append(process)

    def stop(self) -> None:
        for process in self.processes:
            process.stop()
        self.stack.stop()

    def http(self) -> httpx.Client:
        assert self.info is not None
        return httpx.Client(base_url=self.info.api_url, timeout=120,
                            headers={"Authorization": f"Bearer {self.info.token}"})  # fmt: skip

    def _scalar(self, sql: str, *args: object) -> int:
        assert self.info is not None
        with psycopg.connect(self.info.database_url) as conn:
            row = conn.execute(sql, args).fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def _wait_for_app(self, site: str) -> None:
        with self.http() as http:
            for _ in range(600):
                apps = http.get("/apps", params={"site": site}).json()
                if any(a["name"] == "work" for a in apps):
                    return
                time.sleep(0.1)
        raise RuntimeError(f"the agent of {site} did not register its app")

    def _jobs(self, site: str, n: int, tag: str, **extra: Any) -> list[dict[str, Any]]:
        return [{"site": site, "app": "work", "workdir": f"{tag}/{i}", "tags": {"run": tag},
                 "node_packing_count": self.slots, **extra} for i in range(n)]  # fmt: skip

    def run(self, jobs: list[dict[str, Any]], tag: str) -> float:
        """Submit ``jobs`` in one request; seconds until all are JOB_FINISHED."""
        started = time.perf_counter()
        with self.http() as http:
            http.post("/jobs", json={"jobs": jobs}).raise_for_status()
        query = "SELECT count(*) FROM rm.jobs WHERE state = 'JOB_FINISHED' AND tags @> %s::jsonb"
        deadline = time.monotonic() + 600
        while self._scalar(query, json.dumps({"run": tag})) < len(jobs):
            if time.monotonic() > deadline:
                raise RuntimeError(f"run {tag} did not finish; see {self.root}")
            time.sleep(0.05)
        return time.perf_counter() - started

    def warm_up(self) -> dict[str, float]:
        """One wave per site, by name; each site's median run time (RUNNING → JOB_FINISHED)."""
        tag = f"warm-{uuid.uuid4().hex[:8]}"
        self.run([job for site in SITES for job in self._jobs(site, self.slots, tag)], tag)
        assert self.info is not None
        medians = {}
        with psycopg.connect(self.info.database_url) as conn:
            for site in SITES:
                rows = conn.execute(
                    "SELECT extract(epoch FROM (stage_times->>'JOB_FINISHED')::timestamptz"
                    " - (stage_times->>'RUNNING')::timestamptz) FROM rm.jobs"
                    " WHERE site = %s AND tags @> %s::jsonb",
                    (site, json.dumps({"run": tag})),
                ).fetchall()
                medians[site] = round(statistics.median(float(r[0]) for r in rows), 3)
        return medians

    def routed(self, n: int, strategy: str) -> dict[str, Any]:
        tag = f"auto-{uuid.uuid4().hex[:8]}"
        jobs = self._jobs("auto", n, tag, strategy=strategy)
        makespan = self.run(jobs, tag)
        assert self.info is not None
        with psycopg.connect(self.info.database_url) as conn:
            rows = conn.execute(
                "SELECT site, count(*) FROM rm.jobs WHERE tags @> %s::jsonb GROUP BY site",
                (json.dumps({"run": tag}),),
            ).fetchall()
        split = dict.fromkeys(SITES, 0) | {site: int(count) for site, count in rows}
        return {"strategy": strategy, "jobs": n, "split": split, "makespan_s": round(makespan, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=60)
    parser.add_argument("--seconds", default="0.3,1,3", help="sleep per job at fast,mid,slow")
    parser.add_argument("--slots", type=int, default=2, help="jobs each pilot runs at once")
    parser.add_argument("--strategy", default="fastest_eta")
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    args = parser.parse_args(argv)
    seconds = dict(zip(SITES, (float(s) for s in args.seconds.split(",")), strict=True))
    root = Path(tempfile.mkdtemp(prefix="lode-routing-"))
    root.chmod(0o711)  # Postgres runs as its own account when we are root
    bench = RoutingBench(root, seconds, args.slots)
    slots = dict.fromkeys(SITES, args.slots)
    results: dict[str, Any] = {"date": datetime.now(UTC).isoformat(), "cpus": os.cpu_count(),
                               "seconds": seconds, "slots": args.slots}  # fmt: skip
    try:
        bench.start()
        measured = bench.warm_up()
        results["warm_up_run_s"] = measured
        results["routed"] = bench.routed(args.jobs, args.strategy)
    finally:
        bench.stop()
    results["best_static"] = best_static(args.jobs, measured, slots)
    results["best_static_nominal"] = best_static(args.jobs, seconds, slots)
    ratio = results["routed"]["makespan_s"] / results["best_static"]["makespan_s"]
    results["ratio"] = round(ratio, 3)
    results["target_met"] = ratio <= TARGET_RATIO
    print(json.dumps(results, indent=2), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"routing-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
