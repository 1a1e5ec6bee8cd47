"""The demo workload of ``make run``: eigen-decompositions and a small DAG on a local site.

Modelled on the Balsam paper's matrix-diagonalisation benchmark: every job
runs ``numpy.linalg.eigh`` on a random symmetric matrix through the site's
``eigh`` app; three more jobs form a DAG (two solves feeding a merge). The
summary is computed from each job's per-stage timestamps, which the
projector folds from the events.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lodestream.client.sdk import LodeClient

DEMO_SITE = "local"
DEMO_APP = "eigh"
FINAL = {"JOB_FINISHED", "FAILED", "KILLED"}


@dataclass(frozen=True, slots=True)
class DemoReport:
    submitted: int
    submit_seconds: float
    states: dict[str, int]
    batch_tag: str
    throughput_jobs_s: float
    to_running_ms: tuple[float, float]  # p50, p95
    to_finished_ms: tuple[float, float]
    dag_order_ok: bool
    seconds: float


def demo_jobs(batch: str, count: int, site: str = DEMO_SITE) -> list[dict[str, Any]]:
    """``count`` independent eigh jobs plus a three-job DAG (two solves feeding a merge)."""
    common = {"site": site, "app": DEMO_APP, "node_packing_count": 2, "wall_time_min": 1}
    jobs: list[dict[str, Any]] = [
        {**common, "workdir": f"demo/{batch}/eigh-{i:05d}",
         "parameters": {"n": str(100 + (i % 4) * 100), "seed": str(i)},
         "tags": {"demo": "eigh", "batch": batch}}
        for i in range(count)
    ]  # fmt: skip
    left, right = str(uuid.uuid4()), str(uuid.uuid4())
    dag = {"demo": "dag", "batch": batch}
    jobs += [
        {**common, "id": left, "workdir": f"demo/{batch}/dag-left",
         "parameters": {"n": "300", "seed": "1"}, "tags": dag},
        {**common, "id": right, "workdir": f"demo/{batch}/dag-right",
         "parameters": {"n": "300", "seed": "2"}, "tags": dag},
        {**common, "workdir": f"demo/{batch}/dag-merge", "parameters": {"n": "100", "seed": "3"},
         "tags": {**dag, "role": "merge"}, "parent_ids": [left, right]},
    ]  # fmt: skip
    return jobs


class DemoStopped(Exception):
    """Ctrl-C or SIGTERM arrived while the demo ran."""


def wait_for_app(
    client: LodeClient,
    site: str,
    app: str,
    timeout_s: float = 60,
    stop: threading.Event | None = None,
) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(a["name"] == app for a in client.list_apps(site)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"site {site} did not register app {app!r} in {timeout_s:.0f}s")
        _pause(0.25, stop)


def _pause(seconds: float, stop: threading.Event | None) -> None:
    if stop is None:
        time.sleep(seconds)
    elif stop.wait(seconds):
        raise DemoStopped("stopped")


def run_demo(
    client: LodeClient,
    count: int = 200,
    *,
    timeout_s: float = 600,
    progress: Callable[[dict[str, int]], None] | None = None,
    stop: threading.Event | None = None,
) -> DemoReport:
    """Submit the demo workload and follow it until every job is final (or ``stop`` is set,
    which raises :class:`DemoStopped`)."""
    started = time.monotonic()
    wait_for_app(client, DEMO_SITE, DEMO_APP, stop=stop)
    batch = time.strftime("%Y%m%dT%H%M%S")
    jobs = demo_jobs(batch, count)
    t0 = time.perf_counter()
    client.submit_jobs(jobs, idempotency_key=f"demo-{batch}", wait=True)
    submit_seconds = time.perf_counter() - t0
    tag = f"batch:{batch}"
    deadline = time.monotonic() + timeout_s
    while True:
        projected = list(client.list_jobs(tag=tag))
        states = Counter(job["state"] for job in projected)
        if progress is not None:
            progress(dict(states))
        if sum(states[s] for s in FINAL) == len(jobs) or time.monotonic() > deadline:
            break
        _pause(1.0, stop)
    return _report(projected, submit_seconds, tag, time.monotonic() - started)


def _report(jobs: list[dict[str, Any]], submit_s: float, tag: str, seconds: float) -> DemoReport:
    times = [{k: datetime.fromisoformat(v) for k, v in j["stage_times"].items()} for j in jobs]
    to_running = [(t["RUNNING"] - t["CREATED"]).total_seconds() * 1e3 for t in times
                  if "RUNNING" in t]  # fmt: skip
    to_done = [(t["JOB_FINISHED"] - t["CREATED"]).total_seconds() * 1e3 for t in times
               if "JOB_FINISHED" in t]  # fmt: skip
    finished = [t["JOB_FINISHED"] for t in times if "JOB_FINISHED" in t]
    created = [t["CREATED"] for t in times]
    span = (max(finished) - min(created)).total_seconds() if finished else 0.0
    return DemoReport(
        submitted=len(jobs),
        submit_seconds=submit_s,
        states=dict(Counter(j["state"] for j in jobs)),
        batch_tag=tag,
        throughput_jobs_s=len(finished) / span if span > 0 else 0.0,
        to_running_ms=_p50_p95(to_running),
        to_finished_ms=_p50_p95(to_done),
        dag_order_ok=_dag_in_order(jobs),
        seconds=seconds,
    )


def _p50_p95(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return (values[0], values[0]) if values else (0.0, 0.0)
    cuts = statistics.quantiles(values, n=20)
    return statistics.median(values), cuts[18]


def _dag_in_order(jobs: list[dict[str, Any]]) -> bool:
    """The merge started only after both of its parents had finished."""
    by_id = {j["id"]: j for j in jobs}
    for job in jobs:
        if job["tags"].get("role") != "merge":
            continue
        started = job["stage_times"].get("RUNNING")
        parents_done = [by_id[p]["stage_times"].get("JOB_FINISHED") for p in job["parent_ids"]]
        return bool(started) and all(d is not None and d <= started for d in parents_done)
    return False
