"""Issue-3 benchmarks: no-op jobs through the whole lifecycle, latency, pilot recovery.

    python -m bench.lifecycle [--jobs 20000] [--latency-jobs 100] [--out bench/out]

Starts an embedded stack (api, projector, controller), a local site with its
agent and one pilot, and measures:

* throughput: ``/bin/true`` jobs from the first submission to the last
  JOB_FINISHED visible in the read model (target ≥ 1,000 jobs/s);
* latency on an idle pilot: submit → RUNNING and submit → JOB_FINISHED,
  the first from the folded stage times, the second as the client sees it
  through the API (targets p50 ≤ 30 ms / p95 ≤ 100 ms, and p50 ≤ 100 ms);
* recovery: SIGKILL of a pilot running jobs → every one of its jobs
  RUN_TIMEOUT (target: heartbeat TTL + 2 s).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
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

from bench.probe import CpuMeter
from bench.stack import free_ports
from lodestream.agents.site.directory import init_site_dir
from lodestream.services.embedded import EmbeddedStack, StackInfo
from lodestream.services.embedded.process import ServiceProcess

SITE = "lifebench"
APPS = """
from lodestream.agents.site.apps import ApplicationDefinition


class Noop(ApplicationDefinition):
    name = "noop"
    command_template = "/bin/true"


class Sleep(ApplicationDefinition):
    name = "sleep"
    command_template = "sleep {{ seconds }}"
"""
HEARTBEAT_TTL_S = 10


def quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    cuts = statistics.quantiles(values, n=100) if len(values) > 1 else [values[0]] * 99
    return {"p50": statistics.median(values), "p95": cuts[94], "max": max(values), "n": len(values)}


class LifecycleBench:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.stack = EmbeddedStack(root / "state", free_ports())
        self.info: StackInfo | None = None
        self.pilots: list[ServiceProcess] = []

    # --- setup ------------------------------------------------------------------------------

    apps: str = APPS  # the site's apps/bench.py

    def launcher_settings(self) -> dict[str, Any]:
        """The site's ``launcher`` settings; a bench of another pilot shape overrides it."""
        return {"idle_ttl_s": 3600, "heartbeat_ttl_s": HEARTBEAT_TTL_S,
                "virtual_nodes": 1, "cores_per_node": 64, "max_fetch": 512}  # fmt: skip

    def start(self) -> StackInfo:
        info = self.stack.start("bench")
        site_dir = self.root / "site"
        public_key = init_site_dir(
            site_dir, SITE, nats_url=info.websocket_url, ca_file=info.ca_file,
            api_url=info.api_url, examples=False, launcher=self.launcher_settings(),
        )  # fmt: skip
        (site_dir / "apps" / "bench.py").write_text(self.apps)
        with self.http(info) as http:
            response = http.post("/sites", params={"wait": True},
                                 json={"name": SITE, "public_key": public_key})  # fmt: skip
            response.raise_for_status()
        self.stack.supervise_once()
        cli = [sys.executable, "-m", "lodestream.client.cli.main"]
        agent = ServiceProcess("site-agent", [*cli, "site", "start", str(site_dir)], {},
                               self.root / "agent.log")  # fmt: skip
        agent.start()
        self.stack.services.append(agent)
        self.site_dir = site_dir
        self.info = info
        self._wait_for_apps()
        return info

    def start_pilot(self, name: str) -> ServiceProcess:
        cli = [sys.executable, "-m", "lodestream.client.cli.main", "launcher",
               "--site", str(self.site_dir),
               "--wall-time-min", "600"]  # fmt: skip
        pilot = ServiceProcess(name, cli, {}, self.root / f"{name}.log")
        opened = self._open_sessions()
        pilot.start()
        self.pilots.append(pilot)
        # Measure a pilot that is up: its session is open (it starts leasing right after).
        deadline = time.monotonic() + 60
        while self._open_sessions() <= opened:
            if time.monotonic() > deadline or not pilot.running:
                raise RuntimeError(f"pilot {name} did not open its session; see its log")
            time.sleep(0.05)
        return pilot

    def _open_sessions(self) -> int:
        assert self.info is not None
        with psycopg.connect(self.info.database_url) as conn:
            row = conn.execute(
                "SELECT count(*) FROM rm.sessions WHERE site = %s AND state = 'open'", (SITE,)
            ).fetchone()
        return int(row[0]) if row else 0

    def stop(self) -> None:
        for pilot in self.pilots:
            pilot.stop()
        self.stack.stop()

    def http(self, info: StackInfo | None = None) -> httpx.Client:
        info = info or self.info
        assert info is not None
        return httpx.Client(base_url=info.api_url, timeout=120,
                            headers={"Authorization": f"Bearer {info.token}"})  # fmt: skip

    def _wait_for_apps(self) -> None:
        with self.http() as http:
            for _ in range(600):
                names = {a["name"] for a in http.get("/apps", params={"site": SITE}).json()}
                if {"noop", "sleep"} <= names:
                    return
                time.sleep(0.1)
        raise RuntimeError("the site agent did not register the bench apps")

    def _count(self, state: str, tag: str) -> int:
        assert self.info is not None
        with psycopg.connect(self.info.database_url) as conn:
            row = conn.execute(
                "SELECT count(*) FROM rm.jobs WHERE state = %s AND tags @> %s::jsonb",
                (state, json.dumps({"run": tag})),
            ).fetchone()
        return int(row[0]) if row else 0

    def _jobs(self, n: int, tag: str, app: str = "noop", **extra: Any) -> list[dict[str, Any]]:
        return [{"site": SITE, "app": app, "workdir": f"{tag}/{i}", "tags": {"run": tag},
                 "node_packing_count": 64, **extra} for i in range(n)]  # fmt: skip

    # --- measurements -----------------------------------------------------------------------

    def throughput(self, n: int) -> dict[str, Any]:
        tag = f"tp-{uuid.uuid4().hex[:8]}"
        jobs = self._jobs(n, tag)
        meter = CpuMeter(self.pids()).start()
        started = time.perf_counter()
        with self.http() as http:
            for i in range(0, n, 5000):
                http.post("/jobs", json={"jobs": jobs[i : i + 5000]}).raise_for_status()
        submitted = time.perf_counter() - started
        samples: list[tuple[float, int]] = []
        deadline = time.monotonic() + max(600.0, n / 20)
        while (done := self._count("JOB_FINISHED", tag)) < n and time.monotonic() < deadline:
            samples.append((time.perf_counter() - started, done))
            time.sleep(0.5)
        total = time.perf_counter() - started
        return {"jobs": n, "finished": done, "seconds": total, "submit_seconds": submitted,
                "jobs_per_s": done / total, "cpu_percent": meter.stop(),
                "stage_gaps_ms": self._stage_gaps(tag), "progress": samples[-20:]}  # fmt: skip

    def _stage_gaps(self, tag: str) -> dict[str, dict[str, float]]:
        """p50/p95 of the time between consecutive stages (who made each job wait, and how long)."""
        # No RUN_DONE: the pilot finishes a no-op job in the event that reports its run.
        stages = ["CREATED", "PREPROCESSED", "RUNNING", "JOB_FINISHED"]
        assert self.info is not None
        gaps: dict[str, dict[str, float]] = {}
        with psycopg.connect(self.info.database_url) as conn:
            for before, after in itertools.pairwise(stages):
                row = conn.execute(
                    "SELECT percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY extract("
                    "epoch FROM (stage_times->>%s)::timestamptz - (stage_times->>%s)::timestamptz))"
                    " FROM rm.jobs WHERE tags @> %s::jsonb",
                    (after, before, json.dumps({"run": tag})),
                ).fetchone()
                if row and row[0]:
                    p50, p95 = (round(float(v) * 1000, 1) for v in row[0])
                    gaps[f"{before}->{after}"] = {"p50": p50, "p95": p95}
        return gaps

    def pids(self) -> dict[str, int]:
        """Pids by component: the stack's (Postgres: the postmaster), the agent's, the pilots'."""
        found = {"nats-server": self.stack.nats, "postgres": self.stack.postgres}
        pids = {name: p.pid for name, p in found.items() if p is not None and p.pid is not None}
        for process in [*self.stack.services, *self.pilots]:
            if process.pid is not None:
                pids[process.name] = process.pid
        return pids

    def latency(self, n: int) -> dict[str, Any]:
        to_running: list[float] = []
        to_visible: list[float] = []
        with self.http() as http:
            for i in range(n):
                tag = f"lat-{uuid.uuid4().hex[:8]}"
                t0 = time.perf_counter()
                job_id = http.post("/jobs", json={"jobs": self._jobs(1, tag)}).json()["jobs"][0][
                    "id"
                ]
                while True:
                    job = http.get(f"/jobs/{job_id}")
                    if job.status_code == 200 and job.json()["state"] == "JOB_FINISHED":
                        break
                    time.sleep(0.002)
                to_visible.append((time.perf_counter() - t0) * 1000)
                times = {k: datetime.fromisoformat(v) for k, v in job.json()["stage_times"].items()}
                to_running.append((times["RUNNING"] - times["CREATED"]).total_seconds() * 1000)
                if i % 10 == 0:
                    time.sleep(0.05)
        return {
            "submit_to_running_ms": quantiles(to_running),
            "submit_to_finished_visible_ms": quantiles(to_visible),
        }

    def recovery(self, pilot: ServiceProcess, n: int = 8) -> dict[str, Any]:
        tag = f"rec-{uuid.uuid4().hex[:8]}"
        with self.http() as http:
            jobs = self._jobs(n, tag, app="sleep", parameters={"seconds": "600"})
            http.post("/jobs", json={"jobs": jobs}).raise_for_status()
        while self._count("RUNNING", tag) < n:
            time.sleep(0.05)
        killed_at = datetime.now(UTC)
        assert pilot.pid is not None
        os.kill(pilot.pid, signal.SIGKILL)
        t0 = time.perf_counter()
        while self._count("RUNNING", tag) > 0 and time.perf_counter() - t0 < 120:
            time.sleep(0.05)
        observed = time.perf_counter() - t0
        assert self.info is not None
        with psycopg.connect(self.info.database_url) as conn:
            rows = conn.execute(
                "SELECT e.occurred_at FROM rm.job_events e JOIN rm.jobs j ON j.id = e.job_id "
                "WHERE e.type = 'job.run_timed_out' AND j.tags @> %s::jsonb",
                (json.dumps({"run": tag}),),
            ).fetchall()
        fenced = [(r[0] - killed_at).total_seconds() for r in rows]
        _kill_orphans(self.site_dir)  # a SIGKILLed pilot leaves its tasks behind, as on a node
        return {"jobs": n, "heartbeat_ttl_s": HEARTBEAT_TTL_S, "target_s": HEARTBEAT_TTL_S + 2,
                "all_timed_out_after_s": max(fenced) if fenced else None,
                "observed_in_read_model_s": observed, "timed_out": len(fenced)}  # fmt: skip


def _kill_orphans(site_dir: Path) -> None:
    """Kill task processes still running in ``site_dir``'s data (what a batch job's end does)."""
    data = str((site_dir / "data").resolve())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if str((entry / "cwd").readlink()).startswith(data):
                os.kill(int(entry.name), signal.SIGKILL)
        except OSError:
            continue


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--latency-jobs", type=int, default=100)
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="lode-lifecycle-"))
    root.chmod(0o711)  # Postgres runs as its own account when we are root
    bench = LifecycleBench(root)
    results: dict[str, Any] = {"date": datetime.now(UTC).isoformat(), "cpus": os.cpu_count()}
    try:
        bench.start()
        pilot = bench.start_pilot("pilot-1")
        results["latency"] = bench.latency(args.latency_jobs)
        print(json.dumps(results["latency"], indent=2), flush=True)
        results["throughput"] = bench.throughput(args.jobs)
        print(json.dumps({k: v for k, v in results["throughput"].items() if k != "progress"},
                         indent=2), flush=True)  # fmt: skip
        results["recovery"] = bench.recovery(pilot)
        print(json.dumps(results["recovery"], indent=2), flush=True)
    finally:
        bench.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"lifecycle-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
