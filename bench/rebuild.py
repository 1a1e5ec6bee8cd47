"""Phase 3: rebuild the read models from a log of millions of events.

With the stack's projector stopped, the bulk dataset is appended until the
read model will hold 1,000,000 jobs (30% finished, 10% running, 30%
preprocessed, 30% created); then ``Rebuild(...).run()`` runs in this
process, timed, and the projector is restarted. Where the time goes comes
from a rebuild under cProfile on a second, small stack (see
:func:`profiled_rebuild`) and from the timed run's phase split.
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import logging
import multiprocessing
import pstats
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from bench.append import Appender
from bench.context import SITE, Bench
from bench.dataset import jobs_in_read_model, load_jobs
from bench.probe import CpuMeter
from bench.stack import BenchStack
from bench.stats import profile_summary
from bench.summary import row
from bench.workload import Events
from lodestream.eventlog import EventLog
from lodestream.natsconn import connect
from lodestream.schemas.events import SiteRegistered
from lodestream.schemas.events.site import SiteRegisteredData
from lodestream.schemas.ids import derived_id
from lodestream.services.projector.rebuild import Rebuild, RebuildReport
from lodestream.settings import NatsSettings

TARGET_JOBS = 1_000_000
PROFILE_JOBS = 40_000  # about 108,000 events for the profiled rebuild (scaled)
REBUILD_TARGET_EVENTS_PER_S = 30_000


async def run(bench: Bench, workdir: Path, timeout_s: float) -> dict[str, Any]:
    profiled = await profiled_rebuild(bench.scaled(PROFILE_JOBS), workdir, timeout_s)
    positions = bench.positions
    await positions.caught_up(timeout_s, "before stopping the projector for the rebuild")
    target = bench.scaled(TARGET_JOBS)
    missing = max(target - await jobs_in_read_model(bench), 0)
    projector = bench.stack.service("projector")
    projector.stop()
    try:
        async with asyncio.timeout(timeout_s):
            load = await load_jobs(bench, missing, timeout_s)
            timed = await timed_rebuild(bench)
            # The same log again in one process, beside the split run: the machine drifts.
            single = await timed_rebuild(bench, workers=1)
    finally:
        projector.start()
    await positions.caught_up(timeout_s, "projector after the rebuild")
    return {
        "target_jobs": target,
        "jobs_in_read_model": await jobs_in_read_model(bench),
        "load": load,
        "rebuild": timed,
        "rebuild_one_process": single,
        "profiled_rebuild": profiled,
        "summary": [
            row(f"rebuild ({timed['workers']} processes fold EVENTS)", timed["events_per_s"],
                "events/s", at_least=REBUILD_TARGET_EVENTS_PER_S),
            row("rebuild in one process", single["events_per_s"], "events/s"),
            row("rebuild: events replayed", timed["events"], "events"),
            row("rebuild: wall time", timed["seconds"], "s", digits=1),
            row("rebuild: peak RSS of the rebuilding processes", timed["peak_rss_mb"], "MB"),
            row("bulk append (publish_async, projector stopped)",
                load["append"]["events_per_s"], "events/s"),
        ],
    }  # fmt: skip


def _report(report: RebuildReport) -> dict[str, Any]:
    return {
        "workers": report.workers,
        "events": report.events,
        "jobs": report.jobs,
        "quarantined": report.quarantined,
        "seconds": round(report.seconds, 3),
        "events_per_s": round(report.events_per_second),
        "positions": report.positions,
    }


async def profiled_rebuild(jobs: int, workdir: Path, timeout_s: float) -> dict[str, Any]:
    """Rebuild under cProfile on a stack of its own holding only ``jobs`` bulk-dataset jobs.

    A whole-log rebuild of the main stack under cProfile would take many minutes; the
    per-event work is the same on a smaller log, and the timed run gives the phase split.
    """
    stack = BenchStack(workdir / "profile-stack")
    await asyncio.to_thread(stack.start)
    try:
        for name in ("api", "projector"):
            stack.stop_service(name)
        info = stack.info
        nc = await connect(
            NatsSettings(
                url=info.nats_url, user=info.control_user, password=SecretStr(info.control_password)
            ),
            name="lode-bench-profile",
        )
        try:
            async with asyncio.timeout(timeout_s):
                await EventLog(nc.jetstream()).append(site_registered(SITE, info.user), expect=0)
                events = Events(SITE, info.user)
                appended = await Appender.over(nc).append(events.dataset_chunk(0, jobs), timeout_s)
                profile = cProfile.Profile()
                profile.enable()
                try:
                    report = await Rebuild(nc.jetstream(), info.database_url).run()
                finally:
                    profile.disable()
        finally:
            await nc.close()
    finally:
        await asyncio.to_thread(stack.stop)
    profile.dump_stats(workdir / "rebuild.prof")
    return {
        "note": "own small stack, under cProfile: the rate is slowed down, the split is the point",
        "log_events": appended.events + 1,
        **_report(report),
        "profile": profile_summary(pstats.Stats(profile)),
    }


def site_registered(site: str, owner: str) -> SiteRegistered:
    return SiteRegistered.create(
        site=site,
        aggregate_id=derived_id("site", site),
        actor=f"user:{owner}",
        data=SiteRegisteredData(name=site, owner=owner),
    )


class _Marks(logging.Handler):
    """When the rebuild logs the end of each stream's replay."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.marks: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.marks.append((time.perf_counter(), record.getMessage()))


@contextlib.asynccontextmanager
async def _peak_rss() -> AsyncIterator[list[int]]:
    """Peak resident set of this process (MB) while the block runs, in a one-item list."""
    peak = [_rss_mb()]

    async def sample() -> None:
        while True:
            peak[0] = max(peak[0], _rss_mb())
            await asyncio.sleep(0.25)

    task = asyncio.create_task(sample())
    try:
        yield peak
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _rss_mb() -> int:
    """This process's resident set and its children's (a split rebuild's processes)."""
    pids = ["self", *(str(p.pid) for p in multiprocessing.active_children())]
    return sum(_process_rss_mb(pid) for pid in pids)


def _process_rss_mb(pid: str) -> int:
    try:
        with Path(f"/proc/{pid}/status").open() as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) // 1024
    except OSError:  # it ended meanwhile
        return 0
    return 0


async def timed_rebuild(bench: Bench, workers: int | None = None) -> dict[str, Any]:
    marks = _Marks()
    rebuild_log = logging.getLogger("lodestream.services.projector.rebuild")
    rebuild_log.addHandler(marks)
    rebuild_log.setLevel(logging.INFO)
    meter = CpuMeter(bench.stack.pids()).start()
    rss_before = _rss_mb()
    started = time.perf_counter()
    try:
        async with _peak_rss() as peak:
            report = await Rebuild(
                bench.nc.jetstream(), bench.stack.info.database_url, workers=workers
            ).run()
    finally:
        rebuild_log.removeHandler(marks)
    ended = time.perf_counter()
    cpu = meter.stop()
    replayed = [t for t, message in marks.marks if "replayed up to" in message]
    indexed = [t for t, message in marks.marks if "indexes built" in message]
    phases: dict[str, float] = {}
    if len(replayed) >= 2 and indexed:
        # The rebuild logs the end of each stream's bulk replay (a split one's processes have
        # written their jobs by the end of EVENTS'), then the end of the indexes, built after
        # this process's one write of its jobs.
        phases = {
            "create_schema_and_replay_events_s": round(replayed[0] - started, 3),
            "replay_hb_s": round(replayed[1] - replayed[0], 3),
            "write_jobs_and_index_s": round(indexed[0] - replayed[1], 3),
            "catch_up_and_swap_s": round(ended - indexed[0], 3),
        }
    return {
        **_report(report),
        "phases": phases,
        "rss_before_mb": rss_before,
        "peak_rss_mb": peak[0],
        "cpu_pct": cpu,
    }
