"""Issue-34 benchmark: lodestream against Parsl's HighThroughputExecutor, in one sitting.

    make bench-peers          (installs the pinned Parsl into .venv-bench, then runs this)
    python -m bench.peers [--jobs 2000] [--rounds 3] [--workers 2] [--chunksize 8]

Alternates, round after round on the same machine: Parsl HTEX (``python_app`` and
``bash_app`` no-ops, ``--workers`` workers, run by ``bench/peers_parsl.py`` in the bench
virtualenv) and lodestream (a no-op Python-function app, warm and, for reference, in a
fresh interpreter per job, and ``/bin/true``; the same no-op calls ``--chunksize`` to a job,
as ``LodeExecutor.map(app, ..., chunksize=k)`` submits them; one pilot with the site's
default settings and as many slots as Parsl has workers, submitted through the API, finished
when the read model says so). Prints each figure, the medians and their ratios, CPU seconds
per job by component, and submit → RUNNING latency; writes them as JSON.
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.lifecycle import HEARTBEAT_TTL_S, SITE, LifecycleBench, quantiles
from bench.probe import CpuMeter

APPS = """
from lodestream.agents.site.apps import ApplicationDefinition


class Noop(ApplicationDefinition):
    name = "noop"
    command_template = "/bin/true"


class Sleep(ApplicationDefinition):
    name = "sleep"
    command_template = "sleep {{ seconds }}"


class PyNoop(ApplicationDefinition):
    name = "pynoop"

    def run(self) -> None:
        return None


class PyNoopCold(ApplicationDefinition):
    name = "pynoop_cold"
    isolation = "process"  # a fresh interpreter per job: how every function job ran before

    def run(self) -> None:
        return None
"""
BENCH_SITE = Path(".venv-bench/site")
PROFILED = """
import cProfile, runpy, sys, time
sys.argv[0] = "lode"
profile = cProfile.Profile(time.process_time)
try:
    profile.runcall(runpy.run_module, "lodestream.client.cli.main", run_name="__main__")
except SystemExit:
    pass
finally:
    profile.dump_stats({out!r})
"""


class PeerBench(LifecycleBench):
    """The lifecycle bench's stack, with a site of default settings but ``slots`` cores."""

    apps = APPS

    def __init__(self, root: Path, slots: int, profile: Path | None = None) -> None:
        super().__init__(root)
        self.slots = slots
        self.profile = profile  # the pilot runs under cProfile, its stats written here

    def start_pilot(self, name: str) -> Any:
        if self.profile is None:
            return super().start_pilot(name)
        from lodestream.services.embedded.process import ServiceProcess  # noqa: PLC0415

        # CPU time, not wall time: on a busy machine a send that wakes the reader is
        # descheduled, and a wall-clock profile blames the send for the other process's work.
        cli = [sys.executable, "-c", PROFILED.format(out=str(self.profile)),
               "launcher", "--site", str(self.site_dir), "--wall-time-min", "600"]  # fmt: skip
        pilot = ServiceProcess(name, cli, {}, self.root / f"{name}.log")
        opened = self._open_sessions()
        pilot.start()
        self.pilots.append(pilot)
        deadline = time.monotonic() + 60
        while self._open_sessions() <= opened and time.monotonic() < deadline:
            time.sleep(0.05)
        return pilot

    def launcher_settings(self) -> dict[str, Any]:
        return {"idle_ttl_s": 3600, "heartbeat_ttl_s": HEARTBEAT_TTL_S,
                "cores_per_node": self.slots}  # fmt: skip

    def _jobs(self, n: int, tag: str, app: str = "noop", **extra: Any) -> list[dict[str, Any]]:
        # One slot (core) per job: as many at once as the pilot has slots.
        return [{"site": SITE, "app": app, "workdir": f"{tag}/{i}", "tags": {"run": tag},
                 "node_packing_count": self.slots, **extra} for i in range(n)]  # fmt: skip

    def run_calls(self, n: int, app: str, chunksize: int) -> dict[str, Any]:
        """``n`` calls of a no-parameter Python app, ``chunksize`` to a job (``calls``), as
        ``LodeExecutor.map(app, ..., chunksize=k)`` submits them; rates and CPU per call."""
        jobs = self.run_jobs(n // chunksize, app, calls=[{}] * chunksize)
        done = jobs["finished"] * chunksize
        return {"calls": n, "chunksize": chunksize, "jobs": jobs["jobs"], "finished": done,
                "seconds": jobs["seconds"], "calls_per_s": done / jobs["seconds"],
                "cpu_ms_per_call": {k: round(v / chunksize, 3)
                                    for k, v in jobs["cpu_ms_per_job"].items()}}  # fmt: skip

    def run_jobs(self, n: int, app: str, **extra: Any) -> dict[str, Any]:
        tag = f"{app}-{uuid.uuid4().hex[:8]}"
        jobs = self._jobs(n, tag, app=app, **extra)
        pids = self.pids()
        for pilot in self.pilots:  # its warm workers: alive, so not in its reaped children
            for i, pid in enumerate(descendants(pilot.pid or 0)):
                pids[f"{pilot.name} python worker {i}"] = pid
        meter = CpuMeter(pids).start()
        started = time.perf_counter()
        with self.http() as http:
            for i in range(0, n, 5000):
                http.post("/jobs", json={"jobs": jobs[i : i + 5000]}).raise_for_status()
        deadline = time.monotonic() + max(600.0, n / 5)
        while (done := self._count("JOB_FINISHED", tag)) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        total = time.perf_counter() - started
        cpu = meter.stop()
        return {"jobs": n, "finished": done, "seconds": total, "jobs_per_s": done / total,
                "cpu_ms_per_job": {k: round(v / 100 * total / max(done, 1) * 1000, 3)
                                   for k, v in cpu.items()}}  # fmt: skip

    def latency_to_running(self, n: int, app: str) -> dict[str, float]:
        to_running: list[float] = []
        with self.http() as http:
            for _ in range(n):
                tag = f"lat-{uuid.uuid4().hex[:8]}"
                job_id = http.post("/jobs", json={"jobs": self._jobs(1, tag, app=app)}).json()[
                    "jobs"
                ][0]["id"]
                while True:
                    job = http.get(f"/jobs/{job_id}")
                    if job.status_code == 200 and job.json()["state"] == "JOB_FINISHED":
                        break
                    time.sleep(0.002)
                times = {k: datetime.fromisoformat(v) for k, v in job.json()["stage_times"].items()}
                to_running.append((times["RUNNING"] - times["CREATED"]).total_seconds() * 1000)
        return quantiles(to_running)


def descendants(root: int) -> list[int]:
    """The live processes below ``root`` (a pilot's warm template and its workers)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        found += children
        frontier += children
    return found


def parsl_round(n: int, workers: int) -> dict[str, Any]:
    """One round of Parsl in the bench virtualenv (a child: its CPU is counted on exit)."""
    env = {**os.environ, "PYTHONPATH": str(BENCH_SITE.resolve()),
           "PATH": f"{(BENCH_SITE / 'bin').resolve()}:{os.environ.get('PATH', '')}"}  # fmt: skip
    before = os.times()
    out = subprocess.run(
        [sys.executable, "-m", "bench.peers_parsl", "--jobs", str(n), "--workers", str(workers)],
        env=env, capture_output=True, text=True, check=True, timeout=1200,
    )  # fmt: skip
    after = os.times()
    doc: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    cpu_s = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    doc["cpu_ms_per_job_all"] = round(cpu_s / (2 * n) * 1000, 3)  # both apps, whole process tree
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--latency-jobs", type=int, default=50)
    # Function jobs in a fresh interpreter each, as before warm workers: the baseline.
    parser.add_argument("--cold-jobs", type=int, default=200)
    # No-op calls k to a job (LodeExecutor.map's chunksize), against python_app; 1: not run.
    parser.add_argument("--chunksize", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    parser.add_argument("--profile-pilot", type=Path, default=None,
                        help="run the pilot under cProfile; its stats go to this file")  # fmt: skip
    args = parser.parse_args(argv)
    if not BENCH_SITE.is_dir():
        parser.error(f"no {BENCH_SITE}: run `make bench-peers` (it installs the pinned Parsl)")
    root = Path(tempfile.mkdtemp(prefix="lode-peers-"))
    root.chmod(0o711)  # Postgres runs as its own account when we are root
    bench = PeerBench(root, args.workers, args.profile_pilot)
    rounds: list[dict[str, Any]] = []
    results: dict[str, Any] = {"date": datetime.now(UTC).isoformat(), "cpus": os.cpu_count(),
                               "jobs": args.jobs, "workers": args.workers}  # fmt: skip
    try:
        bench.start()
        bench.start_pilot("pilot-1")
        bench.run_jobs(200, "pynoop")  # warm-up: caches, consumers, the pilot's workers
        for i in range(args.rounds):
            one: dict[str, Any] = {"parsl": parsl_round(args.jobs, args.workers)}
            one["lode_function"] = bench.run_jobs(args.jobs, "pynoop")
            one["lode_true"] = bench.run_jobs(args.jobs, "noop")
            if args.chunksize > 1:
                one["lode_calls"] = bench.run_calls(args.jobs, "pynoop", args.chunksize)
            if args.cold_jobs:
                one["lode_function_cold"] = bench.run_jobs(args.cold_jobs, "pynoop_cold")
            rounds.append(one)
            print(json.dumps({"round": i, **one}), flush=True)
        results["latency_to_running_ms"] = {
            "pynoop": bench.latency_to_running(args.latency_jobs, "pynoop"),
            "noop": bench.latency_to_running(args.latency_jobs, "noop"),
            "pynoop_cold": bench.latency_to_running(args.latency_jobs, "pynoop_cold"),
        }
    finally:
        bench.stop()
    results["rounds"] = rounds
    results["summary"] = summary(rounds)
    shown = {k: results[k] for k in ("summary", "latency_to_running_ms")}
    print(json.dumps(shown, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"peers-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"wrote {out}")
    return 0


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def med(path: tuple[str, str]) -> float:
        return float(statistics.median(r[path[0]][path[1]] for r in rounds))

    python_app, bash_app = med(("parsl", "python_app_per_s")), med(("parsl", "bash_app_per_s"))
    function, true = med(("lode_function", "jobs_per_s")), med(("lode_true", "jobs_per_s"))
    cold = {}
    if all("lode_function_cold" in r for r in rounds):
        per_s = med(("lode_function_cold", "jobs_per_s"))
        cold = {"lode_function_cold_per_s": round(per_s, 1),
                "ratio_function_warm_vs_cold": round(function / per_s, 2)}  # fmt: skip
    calls = {}
    if all("lode_calls" in r for r in rounds):
        per_s = med(("lode_calls", "calls_per_s"))
        calls = {"lode_calls_per_s": round(per_s, 1),
                 "chunksize": rounds[0]["lode_calls"]["chunksize"],
                 "ratio_calls_vs_python_app": round(per_s / python_app, 3)}  # fmt: skip
    return {
        "parsl_python_app_per_s": round(python_app, 1),
        "parsl_bash_app_per_s": round(bash_app, 1),
        "lode_function_per_s": round(function, 1),
        "lode_true_per_s": round(true, 1),
        "ratio_function_vs_python_app": round(function / python_app, 3),
        "ratio_true_vs_bash_app": round(true / bash_app, 3),
        **cold,
        **calls,
    }


if __name__ == "__main__":
    raise SystemExit(main())
