"""Push feed load: the live projector with 0 and with N clients on ``/events/stream``.

The issue's target: 50 concurrent SSE clients on the dashboard feed (every event of the
user's site, no filter) slow the projector by no more than 10 %. Rounds alternate
without and with clients (off, on, off, on, ...) so drift in the machine's state falls
on both; each round is ``bench.projector.live`` (lifecycle events appended as fast as
possible while the projector folds them). The clients run in a child process of their
own (as browsers would be elsewhere), read the stream and count the events; after each
round the bench waits until the slowest client has been sent the round's last event and
records how long that took (``clients_drained_after_s``).

    python -m bench.sse --clients 50 --jobs 5000 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.context import Bench, open_bench
from bench.projector import live
from bench.report import machine_facts
from bench.stack import BenchError, BenchStack

TIMEOUT_S = 600.0
DRAIN_TIMEOUT_S = 300.0
TARGET_SLOWDOWN = 0.10


async def run_clients(url: str, token: str, clients: int, since: int, out: Path) -> None:
    """Child process: ``clients`` streams from ``since``; writes each one's count at SIGTERM.

    The clients stand for browsers on other machines, so their own cost on this one is kept
    as small as it can be: a plain socket each, frames counted on the raw bytes (each write
    of the api is whole frames, so no pattern is ever split by the chunked encoding's
    size lines), no HTTP or SSE parsing in Python.
    """
    counts = [0] * clients
    last = [since] * clients
    opened = [False] * clients
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    host, port = urlsplit(url).hostname or "127.0.0.1", urlsplit(url).port or 80

    async def one(k: int) -> None:
        while not stop.is_set():  # a lagged client resumes, as EventSource does
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(
                f"GET /events/stream HTTP/1.1\r\nHost: {host}\r\n"
                f"Authorization: Bearer {token}\r\nLast-Event-ID: {last[k]}\r\n"
                "Connection: close\r\n\r\n".encode()
            )
            pending = b"\n"
            while data := await reader.read(1 << 20):
                opened[k] = True
                pending += data
                cut = pending.rfind(b"\n\n")
                if cut < 0:
                    continue
                done, pending = pending[: cut + 2], pending[cut + 1 :]
                counts[k] += done.count(b"\ndata: ") - done.count(b"\nevent: ")
                at = done.rfind(b"\nid: ")
                if at >= 0:
                    last[k] = int(done[at + 5 : done.index(b"\n", at + 1)])
            writer.close()

    async def report() -> None:
        # The slowest client's position, for the parent to wait on after a round.
        while not stop.is_set():
            await asyncio.to_thread(out.with_suffix(".min").write_text, str(min(last)))
            await asyncio.to_thread(out.with_suffix(".open").write_text, str(sum(opened)))
            await asyncio.sleep(0.2)

    tasks = [asyncio.create_task(one(k)) for k in range(clients)]
    tasks.append(asyncio.create_task(report()))
    await stop.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.to_thread(out.write_text, json.dumps({"counts": counts, "last": last}))


async def measure(bench: Bench, clients: int, jobs: int, rounds: int, work: Path) -> dict[str, Any]:
    off: list[dict[str, Any]] = []
    on: list[dict[str, Any]] = []
    for r in range(rounds):
        off.append(await live(bench, jobs, TIMEOUT_S))
        print(f"round {r} without clients: {off[-1]['projector_events_per_s']} events/s")
        on.append(await with_clients(bench, clients, jobs, work / f"clients-{r}.json"))
        print(f"round {r} with {clients} clients: {on[-1]['projector_events_per_s']} events/s")
    rate_off = statistics.median(x["projector_events_per_s"] for x in off)
    rate_on = statistics.median(x["projector_events_per_s"] for x in on)
    slowdown = 1 - rate_on / rate_off
    return {
        "clients": clients,
        "jobs_per_round": jobs,
        "events_per_round": jobs * 4,
        "without_clients": off,
        "with_clients": on,
        "median_events_per_s_without": rate_off,
        "median_events_per_s_with": rate_on,
        "slowdown": round(slowdown, 4),
        "target_met": slowdown <= TARGET_SLOWDOWN,
    }


async def with_clients(bench: Bench, clients: int, jobs: int, out: Path) -> dict[str, Any]:
    since = await bench.positions.stream_last()
    info = bench.stack.info
    argv = [sys.executable, "-m", "bench.sse", "--serve-clients", str(clients),
            "--url", info.api_url, "--token", info.token, "--since", str(since),
            "--out", str(out)]  # fmt: skip
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = await asyncio.to_thread(subprocess.Popen, argv)
    try:
        await all_open(out, clients, 60)
        result = await live(bench, jobs, TIMEOUT_S)
        last = await bench.positions.stream_last()
        ended = time.perf_counter()
        await slowest_at(out, last, DRAIN_TIMEOUT_S)
        result["clients_drained_after_s"] = round(time.perf_counter() - ended, 3)
    finally:
        child.send_signal(signal.SIGTERM)
        await asyncio.to_thread(child.wait, 60)
    # The clients' own CPU (they stand for browsers elsewhere, but run on this machine).
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    result["clients_cpu_s"] = round(
        now.ru_utime + now.ru_stime - reaped.ru_utime - reaped.ru_stime, 2
    )
    received = json.loads(await asyncio.to_thread(out.read_text))
    result["clients_received_min"] = min(received["counts"])
    result["clients_all_at_end"] = all(seq >= last for seq in received["last"])
    return result


async def all_open(out: Path, clients: int, timeout_s: float) -> None:
    """Until every client's stream has begun (the round must not start before)."""
    progress = out.with_suffix(".open")
    async with asyncio.timeout(timeout_s):
        while True:
            text = await asyncio.to_thread(
                lambda: progress.read_text() if progress.exists() else ""
            )
            if text and int(text) >= clients:
                return
            await asyncio.sleep(0.1)


async def slowest_at(out: Path, seq: int, timeout_s: float) -> None:
    """Until every client has been sent ``seq`` (the child reports the slowest)."""
    progress = out.with_suffix(".min")
    async with asyncio.timeout(timeout_s):
        while True:
            text = await asyncio.to_thread(
                lambda: progress.read_text() if progress.exists() else ""
            )
            if text and int(text) >= seq:
                return
            await asyncio.sleep(0.1)


async def main_async(args: argparse.Namespace, stack: BenchStack) -> dict[str, Any]:
    async with open_bench(stack, 1.0) as bench:
        await live(bench, max(args.jobs // 5, 100), TIMEOUT_S)  # warm-up: caches, plans
        return await measure(bench, args.clients, args.jobs, args.rounds, Path(args.work))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=5000, help="jobs per round (4 events each)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    parser.add_argument("--serve-clients", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--token", help=argparse.SUPPRESS)
    parser.add_argument("--since", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--work", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_clients:
        asyncio.run(run_clients(args.url, args.token, args.serve_clients, args.since, args.out))
        return 0
    root = Path(tempfile.mkdtemp(prefix="lode-sse-"))
    root.chmod(0o711)  # Postgres runs as its own account when we are root
    args.work = str(root)
    stack = BenchStack(root)
    record: dict[str, Any] = {"date": datetime.now(UTC).isoformat(), "machine": machine_facts()}
    try:
        stack.start()
        record["sse"] = asyncio.run(main_async(args, stack))
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    finally:
        stack.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"sse-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    out.write_text(json.dumps(record, indent=2, default=str) + "\n")
    summary = {k: v for k, v in record["sse"].items() if not k.startswith("with")}
    print(json.dumps(summary, indent=2))
    print(f"wrote {out} ({os.cpu_count()} cpus)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
