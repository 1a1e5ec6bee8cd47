"""Issue 14: event-replay analytics over a million events, read from a real stream.

    python -m bench.analytics [--events 1000000] [--profile-events 100000] [--workers 1 2]
                              [--out bench/out]

Starts nats-server as the stack runs it (JetStream, the control plane's password user),
appends ``--events`` realistic job events (:mod:`bench.analytics_events`: ~180,000 jobs on
two sites, plain, staged, retried and failed paths, pilot sessions) and then times, each
a full pass over the stream from sequence 1 on the control plane's connection:

* **read**: the messages only (:func:`~lodestream.client.analytics.stream.stream_batches`),
  what the transport costs;
* **split**: the replay with the time inside the shared rule (decode and check,
  :func:`~lodestream.client.analytics.intake.accept`) and inside the fold measured apart;
* **analytics**: :func:`~lodestream.client.analytics.parallel.load_stream_parallel` then
  :func:`~lodestream.client.analytics.summary.summarize`, the headline (targets: ≤ 30 s in
  all, ≥ 50,000 events/s into the analytics), once per ``--workers`` count given, in that
  order (1: the replay in this process, as ``load_stream``; more: split across processes,
  at most one per core);
* **profile**: the last ``--profile-events`` of the stream replayed under cProfile.

The machine is shared: every figure is one run's, on whatever the others left free.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from nats.aio.client import Client
from pydantic import SecretStr

from bench.analytics_events import generate
from bench.append import Appender
from bench.stack import free_port
from bench.stats import profile_summary
from bench.summary import row
from lodestream import aio
from lodestream.client.analytics.figures.latency import StageTable
from lodestream.client.analytics.fold import TimelineFold
from lodestream.client.analytics.intake import IntakeReport, accept
from lodestream.client.analytics.load import load_stream
from lodestream.client.analytics.parallel import load_stream_parallel
from lodestream.client.analytics.selection import Selection
from lodestream.client.analytics.stream import stream_batches
from lodestream.client.analytics.summary import summarize
from lodestream.collector import collector_paused
from lodestream.eventlog import jetstream
from lodestream.eventlog.streams import ensure_streams
from lodestream.infra.nats.auth import CONTROL_USER, new_password, render_authorization
from lodestream.infra.nats.config import NatsServerConfig
from lodestream.infra.nats.server import NatsServer
from lodestream.natsconn import connect
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.settings import NatsSettings
from lodestream.shares import DEFAULT_WORKERS, usable_workers

TOTAL_TARGET_S: Final = 30.0
REPLAY_TARGET_PER_S: Final = 50_000
APPEND_TIMEOUT_S: Final = 1800.0


async def append(nc: Client, events: int) -> dict[str, Any]:
    started = time.perf_counter()
    stats = await Appender.over(nc).append(generate(events, "bench"), APPEND_TIMEOUT_S)
    seconds = time.perf_counter() - started
    last = (await jetstream(nc).stream_info(EVENTS_STREAM)).state.last_seq
    return {"events": stats.events, "stream_last_seq": last, "errors": stats.errors,
            "first_error": stats.first_error, "seconds_with_generation": round(seconds, 2),
            "events_per_s": round(stats.events / seconds),
            "avg_payload_bytes": round(stats.payload_bytes / max(stats.events, 1))}  # fmt: skip


async def read_only(nc: Client) -> dict[str, Any]:
    count, started = 0, time.perf_counter()
    async for raws in stream_batches(nc, Selection()):
        count += len(raws)
    seconds = time.perf_counter() - started
    return {"events": count, "seconds": round(seconds, 2), "events_per_s": round(count / seconds)}


async def split(nc: Client) -> dict[str, Any]:
    """The replay of :class:`~lodestream.client.analytics.replay.Replay`, timed by part."""
    report = IntakeReport()
    fold = TimelineFold(Selection(), report)
    rule_s = fold_s = 0.0
    started = time.perf_counter()
    with collector_paused():  # as load_stream replays
        async for raws in stream_batches(nc, Selection()):
            t0 = time.perf_counter()
            accepted = accept(raws, report)
            t1 = time.perf_counter()
            for seq, event in accepted:
                fold.apply(seq, event)
            rule_s += t1 - t0
            fold_s += time.perf_counter() - t1
    total = time.perf_counter() - started
    n = report.read
    return {
        "events": n, "seconds": round(total, 2), "events_per_s": round(n / total),
        "shared_rule_s": round(rule_s, 2), "shared_rule_us_per_event": round(rule_s / n * 1e6, 1),
        "fold_s": round(fold_s, 2), "fold_us_per_event": round(fold_s / n * 1e6, 1),
        "read_s": round(total - rule_s - fold_s, 2),
        "read_us_per_event": round((total - rule_s - fold_s) / n * 1e6, 1),
        "refused": report.refused, "illegal": report.illegal,
    }  # fmt: skip


async def analytics(nc: Client, workers: int) -> dict[str, Any]:
    started = time.perf_counter()
    loaded = await load_stream_parallel(nc, Selection(), workers=workers)
    replayed = time.perf_counter()
    summary = summarize(loaded)
    done = time.perf_counter()
    replay_s, figures_s = replayed - started, done - replayed
    n = loaded.intake.read
    stages = summary.stages
    solution = stages.row("time to solution").spread if isinstance(stages, StageTable) else None
    return {
        "workers": usable_workers(workers), "events": n, "jobs": summary.jobs,
        "jobs_by_state": summary.jobs_by_state,
        "sessions": summary.sessions, "refused": loaded.intake.skipped,
        "replay_s": round(replay_s, 2), "replay_events_per_s": round(n / replay_s),
        "figures_s": round(figures_s, 2), "total_s": round(replay_s + figures_s, 2),
        "time_to_solution_mean_s": round(solution.mean, 3) if solution else None,
    }  # fmt: skip


async def profiled(nc: Client, last: int, events: int, out: Path) -> dict[str, Any]:
    selection = Selection.of(since_seq=max(1, last - events + 1))
    profiler = cProfile.Profile()
    profiler.enable()
    loaded = await load_stream(nc, selection)
    summarize(loaded)
    profiler.disable()
    profiler.dump_stats(out)
    return {"events": loaded.intake.read, "profile": profile_summary(pstats.Stats(str(out)))}


async def main_async(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    password = new_password()
    config = NatsServerConfig(
        server_name="bench-analytics", store_dir=root / "store", client_port=free_port(),
        http_port=free_port(), authorization=render_authorization(CONTROL_USER, password, {}),
    )  # fmt: skip
    server = NatsServer(config, root / "nats")
    server.start()
    try:
        settings = NatsSettings(url=server.client_url, user=CONTROL_USER,
                                password=SecretStr(password), name="bench-analytics")  # fmt: skip
        nc = await connect(settings)
        try:
            await ensure_streams(jetstream(nc), heartbeat_ttl_s=10)
            figures: dict[str, Any] = {"append": await append(nc, args.events)}
            figures["read"] = await read_only(nc)
            figures["split"] = await split(nc)
            runs = {n: await analytics(nc, n) for n in args.workers}
            figures["analytics"] = runs[args.workers[0]]
            figures["analytics_by_workers"] = runs
            last = figures["append"]["stream_last_seq"]
            figures["profiled"] = await profiled(nc, last, args.profile_events,
                                                 root / "analytics.prof")  # fmt: skip
        finally:
            await nc.close()
    finally:
        server.stop()
    by_workers: dict[int, dict[str, Any]] = figures["analytics_by_workers"]
    figures["summary"] = [
        *(row(f"analytics over the stream, total, {n} worker(s)", result["total_s"], "s",
              at_most=TOTAL_TARGET_S, digits=1)
          for n, result in by_workers.items()),
        *(row(f"replay into the analytics, {n} worker(s)", result["replay_events_per_s"],
              "events/s", at_least=REPLAY_TARGET_PER_S)
          for n, result in by_workers.items()),
        row("read only (transport)", figures["read"]["events_per_s"], "events/s"),
        row("shared rule per event", figures["split"]["shared_rule_us_per_event"], "µs", digits=1),
        row("fold per event", figures["split"]["fold_us_per_event"], "µs", digits=1),
    ]  # fmt: skip
    return figures


def main() -> None:
    from bench.report import machine_facts  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--profile-events", type=int, default=100_000)
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[1, max(2, usable_workers(DEFAULT_WORKERS))],
        help="replay processes, one analytics pass per count given",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-analytics-") as tmp:
        figures = aio.run(main_async(args, Path(tmp)))
    record = {"bench": "analytics", "at": datetime.now(UTC).isoformat(),
              "args": vars(args) | {"out": str(args.out)}, "machine": machine_facts(),
              **figures}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"analytics-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(record, indent=2))
    print(json.dumps({k: v for k, v in figures.items() if k != "profiled"}, indent=2))
    print(json.dumps(figures["profiled"]["profile"]["top_tottime"][:12], indent=1))
    print(f"record: {path}")


if __name__ == "__main__":
    main()
