"""Issue-12 benchmarks: stage-in arrival rate against the transfer batch size, and the site's
stage cache on and off on a workload that reads the same inputs many times.

    python -m bench.staging [--jobs 400] [--batch-sizes 1,4,16,64] [--latency-s 1.0]
                            [--concurrent 2] [--out bench/out]
    python -m bench.staging --diffusion [--jobs 2000] [--inputs 50] [--size-mb 2]
                            [--batch-sizes 100] [--latency-s 1.0]
    python -m bench.staging --ssh [--jobs 200] [--batch-sizes 100] [--concurrent 5]
                            [--latency-s 0] [--control-persist-s 60]

``--ssh``: the location is ``rsync://root@127.0.0.1:<port>/...`` served by a real sshd on
loopback (``tests/fixtures/sshd.py``, run as root); besides the rates it reports the ssh logins
sshd accepted (its log's ``Accepted publickey`` lines) and the tasks used. Issue 31.9 and 31.12:
items spread over task slots, one shared ssh connection per location (``--control-persist-s
0``: a login per rsync run, as before).

The shape of the Balsam paper's Figure 6: how fast staged jobs arrive when every transfer
task pays a fixed overhead (a wide-area service's submit-and-poll round trips), as a
function of how many items go in one task. Starts an embedded stack (api, projector,
controller); for each batch size a fresh local site whose one location is a directory of
this machine served by the local backend, with ``transfers.simulated_task_latency_s`` as
the per-task overhead and ``max_concurrent`` tasks in flight. Each job stages one small
input; no pilot runs, so what is measured is the staging pipeline alone: api → controller
(items) → site transfer module → backend → controller (``job.staged_in``) → the site's
preprocess step → PREPROCESSED in the read model.

Expected shape: the rate grows with the batch size as ``batch * concurrent / latency``
until the rest of the pipeline (events per item, the polling interval) bounds it.
Writes ``staging.json`` and ``staging.svg`` (the rate per batch size) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import yaml

from bench.stack import free_ports
from lodestream.agents.site.directory import init_site_dir
from lodestream.services.embedded import EmbeddedStack, StackInfo
from lodestream.services.embedded.process import ServiceProcess
from tests.fixtures.sshd import SshServer

APPS = """
from lodestream.agents.site.apps import ApplicationDefinition


class Ingest(ApplicationDefinition):
    name = "ingest"
    command_template = "/bin/true"
    transfers = {"frame": {"direction": "in", "local_path": "frame.dat", "required": True,
                           "cache": True}}
"""


class StagingBench:
    def __init__(
        self,
        root: Path,
        *,
        latency_s: float,
        concurrent: int,
        ssh: SshServer | None = None,
        control_persist_s: int | None = None,
    ) -> None:
        self.root = root
        self.ssh = ssh
        self.control_persist_s = control_persist_s
        self.stack = EmbeddedStack(root / "state", free_ports())
        self.latency_s = latency_s
        self.concurrent = concurrent
        self.info: StackInfo | None = None

    def start(self, *, inputs: int = 64, size: int = 4096) -> None:
        self.info = self.stack.start("bench")
        self.source = self.root / "beamline"
        self.source.mkdir()
        self.inputs = inputs
        block = bytes(range(256)) * 16
        for i in range(inputs):
            (self.source / f"frame-{i}.dat").write_bytes((block * (size // len(block) + 1))[:size])

    def stop(self) -> None:
        self.stack.stop()

    def http(self) -> httpx.Client:
        assert self.info is not None
        return httpx.Client(base_url=self.info.api_url, timeout=120,
                            headers={"Authorization": f"Bearer {self.info.token}"})  # fmt: skip

    def site(self, batch_size: int, *, cache_bytes: int = 0, name: str = "") -> str:
        """A fresh site staging through the local backend in batches of ``batch_size``."""
        assert self.info is not None
        name = name or f"stage{batch_size}"
        site_dir = self.root / name
        public_key = init_site_dir(
            site_dir, name, nats_url=self.info.websocket_url, ca_file=self.info.ca_file,
            api_url=self.info.api_url, examples=False,
        )  # fmt: skip
        settings = yaml.safe_load((site_dir / "settings.yml").read_text())
        settings["transfers"] = {
            "locations": {"beamline": f"local:{self.source}"},
            "batch_size": batch_size, "max_concurrent": self.concurrent,
            "poll_interval_s": 0.1, "simulated_task_latency_s": self.latency_s,
            "stage_cache_bytes": cache_bytes,
        }  # fmt: skip
        if self.ssh is not None:
            server = self.ssh
            settings["transfers"] |= {
                "locations": {"beamline":
                              f"rsync://{server.user}@{server.host}:{server.port}{self.source}"},
                "ssh_identity": str(server.identity_file), "ssh_options": list(server.ssh_options),
            }  # fmt: skip
            if self.control_persist_s is not None:  # a setting the code before 31.12 refuses
                settings["transfers"]["rsync"] = {
                    "beamline": {"control_persist_s": self.control_persist_s}
                }
        (site_dir / "settings.yml").write_text(yaml.safe_dump(settings, sort_keys=False))
        (site_dir / "apps" / "bench.py").write_text(APPS)
        with self.http() as http:
            http.post("/sites", params={"wait": True},
                      json={"name": name, "public_key": public_key}).raise_for_status()  # fmt: skip
        self.stack.supervise_once()
        agent = ServiceProcess(
            f"agent-{name}",
            [sys.executable, "-m", "lodestream.client.cli.main", "site", "start", str(site_dir)],
            {}, self.root / f"agent-{name}.log",
        )  # fmt: skip
        agent.start()
        self.stack.services.append(agent)
        self._wait_ready(name)
        return name

    def _wait_ready(self, site: str) -> None:
        """The app is registered and the locations declared: a submission can be checked."""
        assert self.info is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with psycopg.connect(self.info.database_url) as conn:
                row = conn.execute(
                    "SELECT s.transfer_locations, count(a.name) FROM rm.sites s "
                    "LEFT JOIN rm.apps a ON a.site = s.name WHERE s.name = %s "
                    "GROUP BY s.transfer_locations", (site,),
                ).fetchone()  # fmt: skip
            if row and row[0] and row[1]:
                return
            time.sleep(0.1)
        raise RuntimeError(f"site {site} did not come up; see its agent's log")

    def run(self, site: str, jobs: int) -> dict[str, Any]:
        body = [
            {"site": site, "app": "ingest", "workdir": f"j{i}",
             "transfers": {"frame": {"location": "beamline",
                                     "path": f"/frame-{i % self.inputs}.dat"}}}
            for i in range(jobs)
        ]  # fmt: skip
        started = time.perf_counter()
        with self.http() as http:
            http.post("/jobs", json={"jobs": body}).raise_for_status()
        deadline = time.monotonic() + max(600.0, jobs * 5 * self.latency_s)
        while (done := self._count(site)) < jobs and time.monotonic() < deadline:
            time.sleep(0.2)
        seconds = time.perf_counter() - started
        arrivals = self._arrivals(site)
        span = (arrivals[-1] - arrivals[0]).total_seconds() if len(arrivals) > 1 else 0.0
        return {
            "jobs": jobs, "staged": done, "seconds": round(seconds, 2),
            "rate_per_s": round(done / seconds, 2) if seconds else 0.0,
            # The arrival rate once staging runs (first to last job.staged_in), as in Fig. 6.
            "arrival_rate_per_s": round((len(arrivals) - 1) / span, 2) if span else 0.0,
            "tasks": self._tasks(site), **self._moved(site), **self._logins(),
        }  # fmt: skip

    def _logins(self) -> dict[str, int]:
        """ssh logins sshd accepted since the last call (none without ``--ssh``)."""
        if self.ssh is None:
            return {}
        lines = (self.ssh.root / "sshd.log").read_text(errors="replace").splitlines()
        total = sum("Accepted publickey" in line for line in lines)
        seen, self._seen_logins = getattr(self, "_seen_logins", 0), total
        return {"ssh_logins": total - seen}

    def _count(self, site: str) -> int:
        assert self.info is not None
        with psycopg.connect(self.info.database_url) as conn:
            row = conn.execute(
                "SELECT count(*) FROM rm.jobs WHERE site = %s AND state = 'PREPROCESSED'", (site,)
            ).fetchone()
        return int(row[0]) if row else 0

    def _arrivals(self, site: str) -> list[datetime]:
        assert self.info is not None
        with psycopg.connect(self.info.database_url) as conn:
            rows = conn.execute(
                "SELECT occurred_at FROM rm.job_events WHERE site = %s AND type = 'job.staged_in' "
                "ORDER BY occurred_at", (site,),
            ).fetchall()  # fmt: skip
        return [row[0] for row in rows]

    def _moved(self, site: str) -> dict[str, Any]:
        """Bytes moved from the location, and the items the stage cache served."""
        assert self.info is not None
        with psycopg.connect(self.info.database_url) as conn:
            row = conn.execute(
                "SELECT coalesce(sum(bytes_transferred), 0), count(*) FILTER (WHERE cached), "
                "count(*) FROM rm.transfer_items WHERE site = %s", (site,),
            ).fetchone()  # fmt: skip
        moved, cached, total = row if row else (0, 0, 0)
        return {"bytes_moved": int(moved), "cache_hits": int(cached),
                "hit_rate": round(cached / total, 3) if total else 0.0}  # fmt: skip

    def _tasks(self, site: str) -> int:
        assert self.info is not None
        with psycopg.connect(self.info.database_url) as conn:
            row = conn.execute(
                "SELECT count(DISTINCT task_id) FROM rm.transfer_items WHERE site = %s", (site,)
            ).fetchone()
        return int(row[0]) if row else 0


def svg(results: dict[int, dict[str, Any]], latency_s: float, concurrent: int) -> str:
    """A plain bar chart of the arrival rate per batch size (no plotting library needed)."""
    width, height, pad = 560, 320, 50
    sizes = sorted(results)
    top = max((r["arrival_rate_per_s"] for r in results.values()), default=1.0) or 1.0
    bar = (width - 2 * pad) / max(len(sizes), 1)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        f'<text x="{width / 2}" y="20" text-anchor="middle">stage-in arrival rate (jobs/s), '
        f"{latency_s:g} s per task, {concurrent} tasks in flight</text>",
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" '
        'stroke="black"/>',
    ]
    for i, size in enumerate(sizes):
        rate = results[size]["arrival_rate_per_s"]
        h = (height - 2 * pad) * rate / top
        x = pad + i * bar + bar * 0.15
        parts += [
            f'<rect x="{x:.1f}" y="{height - pad - h:.1f}" width="{bar * 0.7:.1f}" '
            f'height="{h:.1f}" fill="#4a7ab5"/>',
            f'<text x="{x + bar * 0.35:.1f}" y="{height - pad - h - 4:.1f}" '
            f'text-anchor="middle">{rate:g}</text>',
            f'<text x="{x + bar * 0.35:.1f}" y="{height - pad + 16}" '
            f'text-anchor="middle">batch {size}</text>',
        ]
    parts.append("</svg>")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--batch-sizes", default="1,4,16,64")
    parser.add_argument("--latency-s", type=float, default=1.0)
    parser.add_argument("--concurrent", type=int, default=2)
    parser.add_argument(
        "--diffusion", action="store_true", help="the stage cache off, then on, same inputs"
    )
    parser.add_argument("--inputs", type=int, default=50)
    parser.add_argument("--size-mb", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    parser.add_argument("--ssh", action="store_true", help="an rsync location over a real sshd")
    parser.add_argument("--control-persist-s", type=int, default=None)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.diffusion:
        return diffusion(args)
    if args.ssh:
        return over_ssh(args)
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    results: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="lode-bench-staging-") as tmp:
        Path(tmp).chmod(0o711)  # Postgres runs as its own account when we are root
        bench = StagingBench(Path(tmp), latency_s=args.latency_s, concurrent=args.concurrent)
        bench.start()
        try:
            for size in sizes:
                results[size] = bench.run(bench.site(size), args.jobs)
                print(f"batch {size:>4}: {results[size]}", flush=True)
        finally:
            bench.stop()
    (args.out / "staging.json").write_text(json.dumps(
        {"latency_s": args.latency_s, "concurrent": args.concurrent, "results": results},
        indent=2,
    ))  # fmt: skip
    (args.out / "staging.svg").write_text(svg(results, args.latency_s, args.concurrent))
    print("\n| batch size | tasks | staged jobs/s (first → last) | end to end jobs/s |")
    print("|---|---|---|---|")
    for size in sizes:
        r = results[size]
        print(f"| {size} | {r['tasks']} | {r['arrival_rate_per_s']} | {r['rate_per_s']} |")
    return 0


def over_ssh(args: argparse.Namespace) -> int:
    """Stage-in through an rsync location over a real sshd: rates, tasks and logins."""
    from tests.fixtures.sshd import ssh_server_at  # noqa: PLC0415 - the bench's own sshd

    size = int(args.batch_sizes.split(",")[-1])
    with tempfile.TemporaryDirectory(prefix="lode-bench-ssh-") as tmp:
        Path(tmp).chmod(0o711)  # Postgres runs as its own account when we are root
        (Path(tmp) / "sshd").mkdir()
        with ssh_server_at(Path(tmp) / "sshd") as server:
            bench = StagingBench(
                Path(tmp), latency_s=args.latency_s, concurrent=args.concurrent, ssh=server,
                control_persist_s=args.control_persist_s,
            )  # fmt: skip
            bench.start(inputs=args.jobs)
            try:
                bench._logins()
                result = bench.run(bench.site(size, name="ssh"), args.jobs)
            finally:
                bench.stop()
    print(json.dumps(result, indent=2))
    (args.out / "staging-ssh.json").write_text(json.dumps(
        {"batch_size": size, "concurrent": args.concurrent, "latency_s": args.latency_s,
         "control_persist_s": args.control_persist_s, "result": result}, indent=2))  # fmt: skip
    return 0


def diffusion(args: argparse.Namespace) -> int:
    """The same workload through a site without and a site with the stage cache."""
    batch = int(args.batch_sizes.split(",")[-1])
    size = int(args.size_mb * 1024 * 1024)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="lode-bench-diffusion-") as tmp:
        Path(tmp).chmod(0o711)  # Postgres runs as its own account when we are root
        bench = StagingBench(Path(tmp), latency_s=args.latency_s, concurrent=args.concurrent)
        bench.start(inputs=args.inputs, size=size)
        try:
            for label, cache_bytes in (("off", 0), ("on", 4 * size * args.inputs)):
                site = bench.site(batch, cache_bytes=cache_bytes, name=f"cache{label}")
                results[label] = bench.run(site, args.jobs)
                print(f"cache {label}: {results[label]}", flush=True)
        finally:
            bench.stop()
    (args.out / "staging-diffusion.json").write_text(json.dumps(
        {"latency_s": args.latency_s, "concurrent": args.concurrent, "batch_size": batch,
         "inputs": args.inputs, "size_bytes": size, "results": results}, indent=2,
    ))  # fmt: skip
    print("\n| stage cache | makespan (s) | jobs/s | MB moved from the location | hit rate |")
    print("|---|---|---|---|---|")
    for label, r in results.items():
        print(f"| {label} | {r['seconds']} | {r['rate_per_s']} | "
              f"{r['bytes_moved'] / 1e6:,.1f} | {r['hit_rate']} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
