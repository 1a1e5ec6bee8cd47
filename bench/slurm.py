"""Issue-11 benchmarks: pilots as Slurm batch jobs, on the local test cluster (3 nodes of 4 CPUs).

    python -m bench.slurm [--runs 5] [--jobs 1000] [--srun-jobs 200] [--out bench/out]

Needs root and Debian's slurmctld, slurmd and slurm-client (``make slurm-deps``): it starts
the cluster of ``tests/fixtures/slurm.py``, an embedded stack (``lode up``'s), and a site whose
agent submits pilots with ``sbatch``. It measures:

* **request → first RUNNING job**: a no-op job waits at the site; a pilot is requested through
  the API; the time until the job is RUNNING, p50 over ``--runs``, cut into: the request until
  ``batch.submitted`` (API, the agent's delivery, the template, ``sbatch``); Slurm's own
  scheduling (``sbatch`` returned → RUNNING in ``squeue``, polled every 20 ms); the pilot's
  start (RUNNING in squeue → its ``session.opened``: Python, node discovery, wss connect); and
  the lease (session open → the job's ``job.started``);
* **no-op throughput of one pilot**, ``/bin/true`` jobs, ``--packing`` per core of a 4-core
  node (``node_packing_count``): the
  same pilot (machine ``local``, 4 cores, the local app launcher) outside Slurm and inside a
  1-node Slurm allocation; and the pilot a Slurm site runs (machine ``generic-slurm``, each task
  an ``srun`` step). Jobs are submitted first; the rate counts from the first job RUNNING to the
  last JOB_FINISHED, so the pilot's start is not in it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import yaml

from bench.stack import free_ports
from lodestream.agents.site.directory import init_site_dir
from lodestream.services.embedded import EmbeddedStack, StackInfo
from lodestream.services.embedded.process import ServiceProcess
from tests.fixtures.slurm import SlurmCluster, skip_reason, slurm_cluster_at

SITE = "slurmbench"
APPS = """
from lodestream.agents.site.apps import ApplicationDefinition


class Noop(ApplicationDefinition):
    name = "noop"
    command_template = "/bin/true"
"""
SAME_PILOT = {"machine": "local", "virtual_nodes": 1, "cores_per_node": 4}
SLURM_PILOT = {"machine": "generic-slurm", "virtual_nodes": 1, "cores_per_node": None}
POLL_S = 0.02


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50": round(statistics.median(ordered), 3), "min": round(ordered[0], 3),
            "max": round(ordered[-1], 3), "n": len(ordered)}  # fmt: skip


class SlurmBench:
    def __init__(self, root: Path, cluster: SlurmCluster) -> None:
        self.root = root
        self.cluster = cluster
        self.stack = EmbeddedStack(root / "state", free_ports())
        self.site_dir = root / "site"
        self.info: StackInfo | None = None
        self.agent: ServiceProcess | None = None

    # --- setup ------------------------------------------------------------------------------

    def start(self) -> None:
        info = self.stack.start("bench")
        public_key = init_site_dir(
            self.site_dir, SITE, nats_url=info.websocket_url, ca_file=info.ca_file,
            api_url=info.api_url, examples=False,
        )  # fmt: skip
        (self.site_dir / "apps" / "bench.py").write_text(APPS)
        self.configure(scheduler={"type": "slurm", "queue": "debug", "sync_interval_s": 0.5,
                                  "jobcomp_path": str(self.cluster.jobcomp_path)},
                       launcher={**SAME_PILOT, "idle_ttl_s": 2})  # fmt: skip
        self.info = info
        with self.http() as http:
            http.post("/sites", params={"wait": True},
                      json={"name": SITE, "public_key": public_key}).raise_for_status()  # fmt: skip
        self.stack.supervise_once()
        # The agent runs sbatch and squeue against the test cluster; its pilots inherit that.
        os.environ.update({k: v for k, v in self.cluster.env.items() if k == "SLURM_CONF"})
        cli = [sys.executable, "-m", "lodestream.client.cli.main"]
        self.agent = ServiceProcess("site-agent", [*cli, "site", "start", str(self.site_dir)],
                                    {}, self.root / "agent.log")  # fmt: skip
        self.agent.start()
        self.stack.services.append(self.agent)
        for _ in range(600):
            with self.http() as http:
                if any(a["name"] == "noop" for a in http.get("/apps").json()):
                    return
            time.sleep(0.1)
        raise RuntimeError("the site agent did not register the bench app")

    def configure(self, **sections: dict[str, Any]) -> None:
        """Rewrite sections of the site's settings.yml (pilots read it when they start)."""
        path = self.site_dir / "settings.yml"
        settings = yaml.safe_load(path.read_text())
        for name, values in sections.items():
            settings[name] = {**settings.get(name, {}), **values}
        path.write_text(yaml.safe_dump(settings, sort_keys=False))

    def stop(self) -> None:
        self.stack.stop()

    def http(self) -> httpx.Client:
        assert self.info is not None
        return httpx.Client(base_url=self.info.api_url, timeout=60,
                            headers={"Authorization": f"Bearer {self.info.token}"})  # fmt: skip

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        assert self.info is not None
        with psycopg.connect(self.info.database_url) as conn:
            return conn.execute(query, params).fetchall()

    # --- helpers ----------------------------------------------------------------------------

    def submit(self, n: int, tag: str, packing: int = 1) -> None:
        jobs = [{"site": SITE, "app": "noop", "workdir": f"{tag}/{i}", "tags": {"run": tag},
                 "node_packing_count": packing} for i in range(n)]  # fmt: skip
        with self.http() as http:
            for i in range(0, n, 5000):
                http.post("/jobs", json={"jobs": jobs[i : i + 5000]}).raise_for_status()

    def count(self, state: str, tag: str) -> int:
        [(n,)] = self.sql("SELECT count(*) FROM rm.jobs WHERE state = %s AND tags @> %s::jsonb",
                          state, json.dumps({"run": tag}))  # fmt: skip
        return int(n)

    def request_pilot(self, wall_time_min: int = 30) -> str:
        with self.http() as http:
            response = http.post(
                f"/sites/{SITE}/batch-jobs", json={"num_nodes": 1, "wall_time_min": wall_time_min}
            )
            response.raise_for_status()  # fmt: skip
            return str(response.json()["id"])

    def batch(self, batch_id: str) -> dict[str, Any]:
        with self.http() as http:
            job: dict[str, Any] = http.get(f"/batch-jobs/{batch_id}").json()
            return job

    def wait_batch(self, batch_id: str, *states: str, timeout_s: float = 300) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while (job := self.batch(batch_id))["state"] not in states:
            if time.monotonic() > deadline:
                raise RuntimeError(f"batch job {batch_id} is {job['state']}, not {states}")
            time.sleep(POLL_S)
        return job

    def squeue_state(self, scheduler_id: str) -> str:
        done = subprocess.run(
            ["squeue", "-h", "-j", scheduler_id, "-o", "%T"],
            env=self.cluster.env,
            capture_output=True,
            text=True,
            check=False,
        )
        return done.stdout.strip()  # fmt: skip

    def submitted_at(self, batch_id: str) -> datetime:
        """When the agent appended batch.submitted (its clock, right after sbatch returned)."""
        assert self.info is not None
        done = subprocess.run(
            [sys.executable, "-c", _READ_SUBMITTED, self.info.nats_url, self.info.control_user,
             self.info.control_password, f"evt.{SITE}.batch.{batch_id}.submitted"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return datetime.fromisoformat(done.stdout.strip())

    # --- measurements -----------------------------------------------------------------------

    def request_to_first_job(self) -> dict[str, float]:
        """One run: a pilot requested for a waiting no-op job; seconds of each part."""
        tag = f"first-{uuid.uuid4().hex[:8]}"
        self.submit(1, tag)
        while self.count("PREPROCESSED", tag) < 1:
            time.sleep(POLL_S)
        asked = datetime.now(UTC)
        batch_id = self.request_pilot()
        scheduler_id = self.wait_batch(batch_id, "submitted", "queued", "running")["scheduler_id"]
        while self.squeue_state(scheduler_id) not in {"RUNNING", "COMPLETING", "COMPLETED"}:
            time.sleep(POLL_S)
        running_in_squeue = datetime.now(UTC)
        while self.count("JOB_FINISHED", tag) < 1:
            time.sleep(POLL_S)
        [(job_running,)] = self.sql(
            "SELECT (stage_times->>'RUNNING')::timestamptz FROM rm.jobs WHERE tags @> %s::jsonb",
            json.dumps({"run": tag}),
        )
        [(opened,)] = self.sql("SELECT opened_at FROM rm.sessions WHERE batch_job_id = %s",
                               batch_id)  # fmt: skip
        submitted = self.submitted_at(batch_id)
        self.wait_batch(batch_id, "finished")  # idle: the pilot exits; the next run starts clean
        return {
            "request_to_first_running_s": (job_running - asked).total_seconds(),
            "request_to_submitted_s": (submitted - asked).total_seconds(),
            "slurm_submitted_to_running_s": (running_in_squeue - submitted).total_seconds(),
            "pilot_start_s": (opened - running_in_squeue).total_seconds(),
            "session_to_first_running_s": (job_running - opened).total_seconds(),
        }

    def throughput(self, where: str, n: int, packing: int) -> dict[str, Any]:
        """``n`` no-op jobs, ``packing`` per core, through one pilot started ``where``: outside
        Slurm, inside a 1-node allocation, or inside one with tasks as srun steps."""
        self.configure(launcher={**(SLURM_PILOT if where == "inside-srun" else SAME_PILOT),
                                 "idle_ttl_s": 2})  # fmt: skip
        tag = f"tp-{where}-{uuid.uuid4().hex[:8]}"
        self.submit(n, tag, packing)
        while self.count("PREPROCESSED", tag) < n:
            time.sleep(0.1)
        started = time.perf_counter()
        pilot: subprocess.Popen[bytes] | None = None
        batch_id = None
        if where == "outside":
            cli = [sys.executable, "-m", "lodestream.client.cli.main", "launcher",
                   "--site", str(self.site_dir), "--wall-time-min", "30"]  # fmt: skip
            with (self.root / "pilot-outside.log").open("ab") as log:
                pilot = subprocess.Popen(cli, stdout=log, stderr=subprocess.STDOUT)
        else:
            batch_id = self.request_pilot()
        deadline = time.monotonic() + max(600.0, n)
        while (done := self.count("JOB_FINISHED", tag)) < n and time.monotonic() < deadline:
            time.sleep(0.2)
        wall = time.perf_counter() - started
        [(first, last)] = self.sql(
            "SELECT min((stage_times->>'RUNNING')::timestamptz), "
            "max((stage_times->>'JOB_FINISHED')::timestamptz) FROM rm.jobs "
            "WHERE tags @> %s::jsonb", json.dumps({"run": tag}),
        )  # fmt: skip
        if pilot is not None:
            pilot.wait(120)
        if batch_id is not None:
            self.wait_batch(batch_id, "finished")
        span = (last - first).total_seconds()
        return {"where": where, "jobs": n, "per_core": packing, "finished": done,
                "jobs_per_s": round(done / span, 1),
                "running_to_finished_s": round(span, 2),
                "request_to_last_finished_s": round(wall, 2)}  # fmt: skip


_READ_SUBMITTED = """
import asyncio, json, sys, nats
async def main(url, user, password, subject):
    nc = await nats.connect(url, user=user, password=password)
    stored = await nc.jetstream().get_msg("EVENTS", subject=subject, direct=True)
    print(json.loads(stored.data)["occurred_at"])
    await nc.close()
asyncio.run(main(*sys.argv[1:]))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--srun-jobs", type=int, default=200)
    parser.add_argument("--packing", type=int, default=16, help="no-op jobs per core at once")
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    args = parser.parse_args(argv)
    if reason := skip_reason():
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="lode-slurmbench-"))
    root.chmod(0o711)  # Postgres runs as its own account when we are root
    results: dict[str, Any] = {"date": datetime.now(UTC).isoformat(), "cpus": os.cpu_count()}
    with ExitStack() as cleanup:
        cluster = cleanup.enter_context(slurm_cluster_at(Path(tempfile.mkdtemp(prefix="ls-"))))
        bench = SlurmBench(root, cluster)
        cleanup.callback(bench.stop)
        bench.start()
        runs = [bench.request_to_first_job() for _ in range(args.runs)]
        results["runs"] = runs
        parts = {key: quantiles([run[key] for run in runs]) for key in runs[0]}
        results["request_to_first_job"] = parts
        print(json.dumps(results["request_to_first_job"], indent=2), flush=True)
        results["throughput"] = [
            bench.throughput("outside", args.jobs, args.packing),
            bench.throughput("inside", args.jobs, args.packing),
            bench.throughput("inside-srun", args.srun_jobs, args.packing),
        ]
        print(json.dumps(results["throughput"], indent=2), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"slurm-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
