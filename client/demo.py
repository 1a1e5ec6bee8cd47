"""The demo workload of ``make run``: a batch of eigen-decomposition jobs and a small DAG.

Modelled on the Balsam paper's matrix-diagonalisation benchmark. Until a site
agent and launcher run them (see the user guide), the demo shows the jobs
submitted through the API and projected from the log into the read models.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

from client.errors import ApiError
from client.sdk import LodeClient

DEMO_SITE = "local"
DEMO_APP = "eigh"


@dataclass(frozen=True, slots=True)
class DemoReport:
    submitted: int
    submit_seconds: float
    states: dict[str, int]
    batch_tag: str
    sample: list[dict[str, Any]]


def ensure_site(client: LodeClient, site: str = DEMO_SITE) -> None:
    if any(s["name"] == site for s in client.list_sites()):
        return
    try:
        client.register_site(site, "the local demo site", wait=True)
    except ApiError as exc:
        if exc.status != 409:
            raise


def demo_jobs(batch: str, count: int, site: str = DEMO_SITE) -> list[dict[str, Any]]:
    """``count`` independent eigh jobs plus a three-job DAG (two solves feeding a merge)."""
    jobs: list[dict[str, Any]] = [
        {
            "site": site,
            "app": DEMO_APP,
            "workdir": f"demo/{batch}/eigh-{i:05d}",
            "parameters": {"n": str(200 + (i % 5) * 100), "seed": str(i)},
            "tags": {"demo": "eigh", "batch": batch},
            "wall_time_min": 1,
        }
        for i in range(count)
    ]
    left, right = str(uuid.uuid4()), str(uuid.uuid4())
    dag_tags = {"demo": "dag", "batch": batch}
    jobs += [
        {"id": left, "site": site, "app": DEMO_APP, "workdir": f"demo/{batch}/dag-left",
         "parameters": {"n": "300", "seed": "1"}, "tags": dag_tags},
        {"id": right, "site": site, "app": DEMO_APP, "workdir": f"demo/{batch}/dag-right",
         "parameters": {"n": "300", "seed": "2"}, "tags": dag_tags},
        {"site": site, "app": DEMO_APP, "workdir": f"demo/{batch}/dag-merge",
         "parameters": {"n": "100", "seed": "3"}, "tags": dag_tags, "parent_ids": [left, right]},
    ]  # fmt: skip
    return jobs


def run_demo(client: LodeClient, count: int = 200) -> DemoReport:
    ensure_site(client)
    batch = time.strftime("%Y%m%dT%H%M%S")
    jobs = demo_jobs(batch, count)
    started = time.perf_counter()
    client.submit_jobs(jobs, idempotency_key=f"demo-{batch}", wait=True)
    elapsed = time.perf_counter() - started
    projected = list(client.list_jobs(tag=f"batch:{batch}"))
    states = Counter(job["state"] for job in projected)
    return DemoReport(
        submitted=len(jobs),
        submit_seconds=elapsed,
        states=dict(states),
        batch_tag=f"batch:{batch}",
        sample=projected[:5],
    )
