"""Issue 12.4: node-local caches and data-aware dispatch, on versus off, on one workload.

    python -m bench.data_diffusion [--jobs 2000] [--files 50] [--size-mb 4] [--out bench/out]
                                   [--spacing-s 0] [--cache-only]

Starts an embedded stack (api, projector, controller) and a local site, then runs the same
repeated-input workload twice, caching off and on, each time with two fresh pilots
(``lode launcher``) of two virtual nodes each: ``--jobs`` jobs, job *i* reading input
``i mod --files`` (``cksum < ref.dat``) through an input slot declared ``cache=True``.

**Staging is bypassed**: the transfer backends are not on this branch, so no site agent
runs (the controller then knows no app and requests no stage-in), and the bench stages each
input itself as the local backend does with ``transfers.link: true``: a hard link of the
source file into the job's workdir, so the "shared copy" costs nothing to make and every
byte a job reads from it is a byte read from the shared place.

``--spacing-s`` submits the jobs one at a time that many seconds apart instead of all at
once: job *i* and job *i + files* share an input, so with ``--files 10 --spacing-s 0.13``
the second job on an input arrives 1.3 s after the first, while the pilots are mostly idle
(the case where a pull by the wrong pilot, not a full queue, decides where it runs).
``--cache-only`` skips the run with caching off.

Reported per run: makespan (first submission to the last JOB_FINISHED in the read model),
jobs/s, bytes moved from the shared copies to where jobs read them (caching off: every job
reads its whole input there; on: what the pilots copied into node caches, from the
``cache`` of each job's ``job.finished``), hits, misses, hit rate, and deferrals.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import yaml
from pydantic import SecretStr

from bench.lifecycle import HEARTBEAT_TTL_S, SITE, LifecycleBench
from lodestream.agents.site.directory import init_site_dir
from lodestream.eventlog import EventLog, jetstream
from lodestream.natsconn import connect
from lodestream.schemas.events import JobCreated
from lodestream.schemas.resources import JobSpec, TransferSpec
from lodestream.services.embedded import StackInfo
from lodestream.services.embedded.process import ServiceProcess
from lodestream.settings import NatsSettings

APPS = '''
from lodestream.agents.site.apps import ApplicationDefinition, TransferSlot


class ReadsReference(ApplicationDefinition):
    """Reads its whole reference input once."""

    name = "reads_ref"
    command_template = "cksum < ref.dat > sum.txt"
    transfers = {"ref": TransferSlot(direction="in", local_path="ref.dat", cache=True)}
'''
NODES, SLOTS = 2, 4  # per pilot


class DiffusionBench(LifecycleBench):
    def start(self) -> StackInfo:
        info = self.stack.start("bench")
        self.site_dir = self.root / "site"
        public_key = init_site_dir(
            self.site_dir, SITE, nats_url=info.websocket_url, ca_file=info.ca_file,
            api_url=info.api_url, examples=False,
            launcher={"idle_ttl_s": 3600, "heartbeat_ttl_s": HEARTBEAT_TTL_S,
                      "virtual_nodes": NODES, "cores_per_node": SLOTS, "max_fetch": 512},
        )  # fmt: skip
        (self.site_dir / "apps" / "bench.py").write_text(APPS)
        with self.http(info) as http:
            response = http.post("/sites", params={"wait": True},
                                 json={"name": SITE, "public_key": public_key})  # fmt: skip
            response.raise_for_status()
        self.stack.supervise_once()
        self.info = info
        return info

    def configure(self, **launcher: Any) -> None:
        path = self.site_dir / "settings.yml"
        settings = yaml.safe_load(path.read_text())
        settings["launcher"] = {**settings.get("launcher", {}), **launcher}
        path.write_text(yaml.safe_dump(settings, sort_keys=False))

    def sources(self, files: int, size: int) -> list[Path]:
        where = self.root / "sources"
        where.mkdir(exist_ok=True)
        paths = []
        for k in range(files):
            path = where / f"{k}.dat"
            if not path.exists():
                path.write_bytes(os.urandom(size))
            paths.append(path)
        return paths

    def run(
        self, *, cache: bool, jobs: int, sources: list[Path], spacing_s: float = 0.0
    ) -> dict[str, Any]:
        assert self.info is not None
        tag = f"{'on' if cache else 'off'}-{uuid.uuid4().hex[:6]}"
        created = []
        for i in range(jobs):
            k = i % len(sources)
            workdir = f"{tag}/{i}"
            staged = self.site_dir / "data" / workdir / "ref.dat"
            staged.parent.mkdir(parents=True)
            os.link(sources[k], staged)  # the local backend with transfers.link: true
            spec = JobSpec(site=SITE, app="reads_ref", workdir=workdir, tags={"run": tag},
                           transfers={"ref": TransferSpec(location="beamline",
                                                          path=f"/refs/{k}.dat")})  # fmt: skip
            created.append(JobCreated.create(site=SITE, aggregate_id=uuid.uuid4(),
                                             actor="user:bench", data=spec))  # fmt: skip
        size = sum(sources[i % len(sources)].stat().st_size for i in range(jobs))
        self.configure(cache_bytes=(1 << 30) if cache else 0)
        pilots = [self.start_pilot(f"{tag}-p{n}") for n in range(2)]
        started = time.perf_counter()
        asyncio.run(_append(self.info, created, spacing_s))
        deadline = time.monotonic() + max(600.0, jobs / 5)
        while (done := self._count("JOB_FINISHED", tag)) < jobs and time.monotonic() < deadline:
            time.sleep(0.2)
        seconds = time.perf_counter() - started
        for pilot in pilots:
            self.stop_pilot(pilot)
        use = self._cache_use(tag)
        waves = self._misses_by_wave(tag, len(sources))
        moved = use["bytes_copied"] if cache else size
        looked = use["hits"] + use["misses"]
        return {"cache": cache, "jobs": jobs, "finished": done, "makespan_s": round(seconds, 2),
                "jobs_per_s": round(done / seconds, 1), "bytes_moved": moved,
                "bytes_read_by_jobs": size, **use,
                "hit_rate": round(use["hits"] / looked, 4) if looked else None,
                "deferred": _deferrals(self.root, tag), "misses_by_wave": waves}  # fmt: skip

    def stop_pilot(self, pilot: ServiceProcess) -> None:
        pilot.stop(timeout_s=60)
        self.pilots.remove(pilot)

    def _misses_by_wave(self, tag: str, files: int) -> dict[str, int]:
        """Misses of the first job on each input, the second (the case of issue 31.13:
        a job on an input a pilot cached moments before), and all later ones. The first
        wave can only miss; a perfect dispatcher misses nowhere else."""
        assert self.info is not None
        with psycopg.connect(self.info.database_url) as conn:
            rows = conn.execute(
                "SELECT j.workdir, coalesce((e.data->'run'->'cache'->>'misses')::int, 0)"
                " FROM rm.job_events e JOIN rm.jobs j ON j.id = e.job_id"
                " WHERE e.type = 'job.finished' AND j.tags @> %s::jsonb",
                (json.dumps({"run": tag}),),
            ).fetchall()
        waves = {"first": 0, "second": 0, "later": 0}
        for workdir, misses in rows:
            wave = int(str(workdir).rsplit("/", 1)[1]) // files
            waves[("first", "second")[wave] if wave < 2 else "later"] += int(misses)
        return waves

    def _cache_use(self, tag: str) -> dict[str, int]:
        assert self.info is not None
        with psycopg.connect(self.info.database_url) as conn:
            row = conn.execute(
                "SELECT coalesce(sum((e.data->'run'->'cache'->>'hits')::int), 0),"
                " coalesce(sum((e.data->'run'->'cache'->>'misses')::int), 0),"
                " coalesce(sum((e.data->'run'->'cache'->>'bytes_copied')::bigint), 0),"
                " coalesce(sum((e.data->'run'->'cache'->>'bypassed')::int), 0)"
                " FROM rm.job_events e JOIN rm.jobs j ON j.id = e.job_id"
                " WHERE e.type = 'job.finished' AND j.tags @> %s::jsonb",
                (json.dumps({"run": tag}),),
            ).fetchone()
        hits, misses, copied, bypassed = (int(v) for v in row) if row else (0, 0, 0, 0)
        return {"hits": hits, "misses": misses, "bytes_copied": copied, "bypassed": bypassed}


async def _append(info: StackInfo, jobs: list[JobCreated], spacing_s: float) -> None:
    """Submit as the control plane (the api would refuse a location no agent declared).

    All at once in batches of 500, or one by one ``spacing_s`` apart.
    """
    settings = NatsSettings(url=info.nats_url, user=info.control_user,
                            password=SecretStr(info.control_password))  # fmt: skip
    nc = await connect(settings)
    try:
        log = EventLog(jetstream(nc))
        step = 1 if spacing_s > 0 else 500
        for i in range(0, len(jobs), step):
            await log.append_many([(job, 0) for job in jobs[i : i + step]])
            if spacing_s > 0:
                await asyncio.sleep(spacing_s)
    finally:
        await nc.close()


def _deferrals(root: Path, tag: str) -> int:
    """Deliveries the pilots handed back for a peer, from the report each logs at exit."""
    total = 0
    for log in root.glob(f"{tag}-p*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if "exits (" in line and "cache_deferred=" in line:
                total += int(line.split("cache_deferred=")[1].split(",")[0])
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--files", type=int, default=50)
    parser.add_argument("--size-mb", type=float, default=4.0)
    parser.add_argument("--spacing-s", type=float, default=0.0)
    parser.add_argument("--cache-only", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="lode-diffusion-"))
    root.chmod(0o711)  # Postgres runs as its own account when we are root
    bench = DiffusionBench(root)
    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(), "cpus": os.cpu_count(), "jobs": args.jobs,
        "files": args.files, "size_mb": args.size_mb, "pilots": 2, "nodes_per_pilot": NODES,
        "slots_per_node": SLOTS, "spacing_s": args.spacing_s, "runs": [],
    }  # fmt: skip
    try:
        bench.start()
        sources = bench.sources(args.files, int(args.size_mb * 1024 * 1024))
        for cache in (True,) if args.cache_only else (False, True):
            measured = bench.run(cache=cache, jobs=args.jobs, sources=sources,
                                 spacing_s=args.spacing_s)  # fmt: skip
            results["runs"].append(measured)
            print(json.dumps(measured), flush=True)
    finally:
        bench.stop()
    print(table(results["runs"]))
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"data-diffusion-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


def table(runs: list[dict[str, Any]]) -> str:
    lines = ["| caching | makespan (s) | jobs/s | bytes moved (MB) | hits | misses | hit rate "
             "| deferred | misses: first / second / later job on an input |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in runs:
        lines.append(
            f"| {'on' if r['cache'] else 'off'} | {r['makespan_s']} | {r['jobs_per_s']} "
            f"| {r['bytes_moved'] / 1e6:.0f} | {r['hits']} | {r['misses']} "
            f"| {r['hit_rate'] if r['hit_rate'] is not None else '-'} | {r['deferred']} "
            f"| {'{first} / {second} / {later}'.format(**r['misses_by_wave'])} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
