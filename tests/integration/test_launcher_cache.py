"""Node-local caches on the real stack: two pilots, jobs reading a few shared inputs.

Staging is bypassed here, on purpose: no site agent runs, so the controller does not know
the app and requests no transfer items (a job of an unknown app skips stage-in), and the
test puts each job's "staged" input in its workdir itself, as a backend that keeps
modification times (rsync -t, a local copy or link) would. The transfer backends are being
written elsewhere; what is tested here is the pilot's side: cache, events, dispatch.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg

from lodestream.agents.launcher.main import run as run_launcher
from lodestream.eventlog import EventLog
from lodestream.schemas.resources import TransferSpec
from tests.fixtures.nats import SecureNats
from tests.integration.test_launcher import control_plane, started_counts, submit, until_all
from tests.support.builders import job_created, site_registered
from tests.support.site import secure_site_dir

SITE, OWNER = "alpha", "ada"
APP = '''
from lodestream.agents.site.apps import ApplicationDefinition, TransferSlot


class ReadsReference(ApplicationDefinition):
    """Checksums its reference input, which pilots may cache."""

    name = "reads_ref"
    command_template = "cksum < ref.dat > sum.txt"
    transfers = {"ref": TransferSlot(direction="in", local_path="ref.dat", cache=True)}
'''
SOURCES = 4
JOBS = 40
MTIME_NS = 1_700_000_000_000_000_000


def content(k: int) -> bytes:
    return bytes([k]) * (64 * 1024 + k)


def stage(data_dir: Path, workdir: str, k: int) -> None:
    """What the transfer module would leave in the workdir (see the module's docstring)."""
    path = data_dir / workdir / "ref.dat"
    path.parent.mkdir(parents=True)
    path.write_bytes(content(k))
    os.utime(path, ns=(MTIME_NS, MTIME_NS))


async def run_events(dsn: str, ids: list[uuid.UUID]) -> dict[uuid.UUID, dict[str, Any]]:
    """Each job's session (from job.started) and its cache use (from job.finished)."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT job_id, type, data FROM rm.job_events WHERE job_id = ANY(%s) "
            "AND type IN ('job.started', 'job.finished')",
            (ids,),
        )
        found: dict[uuid.UUID, dict[str, Any]] = {}
        for job_id, kind, data in await cursor.fetchall():
            seen = found.setdefault(job_id, {})
            if kind == "job.started":
                seen["session"] = data["session_id"]
            else:
                seen["cache"] = data["run"]["cache"]
        return found


async def test_two_pilots_copy_each_input_once_per_node_and_hit_after(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    settings = secure_site_dir(secure_nats, tmp_path, cache_bytes=10 * 1024 * 1024)
    (settings.apps_dir / "cached.py").write_text(APP)
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        jobs, source_of = [], {}
        for i in range(JOBS):
            k = i % SOURCES
            ref = TransferSpec(location="beamline", path=f"/refs/{k}.dat")
            job = job_created(SITE, OWNER, app="reads_ref", workdir=f"r/{i}",
                              transfers={"ref": ref})  # fmt: skip
            stage(settings.data_dir, f"r/{i}", k)
            jobs.append(job)
            source_of[job.aggregate_id] = k
        stop = asyncio.Event()
        pilots = [
            asyncio.create_task(run_launcher(settings.directory, wall_time_min=10, stop=stop))
            for _ in range(2)
        ]
        ids = await submit(js, jobs)
        await until_all(database_url, ids, "JOB_FINISHED", timeout_s=120)
        stop.set()
        reports = await asyncio.gather(*pilots)

    counts = await started_counts(database_url, ids)
    assert len(counts) == JOBS
    assert set(counts.values()) == {1}  # every job ran exactly once
    events = await run_events(database_url, ids)
    misses: Counter[tuple[str, str, int]] = Counter()
    hits = 0
    for job_id, seen in events.items():
        use = seen["cache"]
        assert use["hits"] + use["misses"] == 1, use
        assert use["bypassed"] == 0
        where = (seen["session"], use["node"], source_of[job_id])
        misses[where] += use["misses"]
        hits += use["hits"]
        assert use["bytes_copied"] == (len(content(source_of[job_id])) if use["misses"] else 0)
    # The first job of a source on a node copies it; every later one there hits.
    assert set(misses.values()) == {1}
    assert hits == JOBS - sum(misses.values())
    assert hits >= JOBS - 2 * 2 * SOURCES  # two pilots of two nodes each
    assert sum(r.cache_hits for r in reports) == hits
    assert sum(r.cache_bytes_copied for r in reports) == sum(
        len(content(k)) * n for (_, _, k), n in misses.items()
    )
    for i, job in enumerate(jobs):
        # The job read its input (through the node's copy); the staged copy is back.
        workdir = settings.data_dir / f"r/{i}"
        crc, size = (workdir / "sum.txt").read_text().split()
        assert int(size) == len(content(source_of[job.aggregate_id])), crc
        assert not (workdir / "ref.dat").is_symlink()
        assert (workdir / "ref.dat").read_bytes() == content(source_of[job.aggregate_id])
    assert not any((settings.directory / "cache").iterdir())  # removed as the pilots exit
