"""Push feed against readers that never read: the api's memory before, during and after.

The issue's finding: 500 ``since=0`` streams whose readers never read took the api from
168 MB to 3,380 MB and kept 1,779 MB after they closed. Here a log of ``--jobs`` job
lifecycles (4 events each) is appended, then ``--readers`` raw sockets with a small
receive buffer (``SO_RCVBUF``) each ask for the feed from sequence 0 and never read, while
``--live-jobs`` more lifecycles are appended. The api's RSS is sampled throughout. Then
each socket reads what the api left it (was it refused with 429? did it say ``event:
lagged``? had the api ended the stream?), all are closed, and the RSS is read again once
the api has let go. ``--max-streams`` raises the api's per-user limit on streams, so that
all the readers are taken and the bound per stream shows.

    python -m bench.sse_slow --readers 500 --jobs 5000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
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
from lodestream.schemas.subjects import EVENTS_STREAM

TIMEOUT_S = 600.0
RCVBUF = 4096
MAX_STREAMS_ENV = "LODE_API__STREAM__MAX_STREAMS_PER_USER"
SAMPLE_S = 0.5


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise BenchError(f"no VmRSS for pid {pid}")


def slow_reader(host: str, port: int, token: str) -> socket.socket:
    """A stream from sequence 0 on a socket that will not read until told to."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)  # before connect: the window
    sock.connect((host, port))
    sock.sendall(
        f"GET /events/stream?since=0 HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {token}\r\n\r\n".encode()
    )
    return sock


async def leftover(sock: socket.socket, wait_s: float) -> tuple[bool, bool, int, bool]:
    """Read what the api left: (it said lagged, it had ended the stream, bytes read, it was
    refused with 429)."""
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    got = bytearray()
    ended = False
    try:
        async with asyncio.timeout(wait_s):
            while chunk := await loop.sock_recv(sock, 1 << 16):
                got += chunk
                if got.endswith(b"0\r\n\r\n"):  # the last chunk of the response
                    break
            ended = True
    except TimeoutError:
        pass
    except OSError:
        ended = True  # reset by the api
    refused = got.startswith(b"HTTP/1.1 429")
    return b"event: lagged" in got, ended, len(got), refused


async def sampled(pid: int, seconds: float, into: list[float]) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        into.append(rss_mb(pid))
        await asyncio.sleep(SAMPLE_S)


async def streams_opened(bench: Bench, before: int, readers: int, timeout_s: float) -> int:
    """Until the api has a consumer for every reader it took (none new for 5 s: the rest
    were refused), or ``timeout_s``; the number of consumers opened."""
    js = bench.nc.jetstream()
    seen, still_since = before, time.monotonic()
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        now = int((await js.stream_info(EVENTS_STREAM)).state.consumer_count)
        if now != seen:
            seen, still_since = now, time.monotonic()
        if seen - before >= readers or time.monotonic() - still_since > 5.0:
            break
        await asyncio.sleep(0.2)
    return seen - before


async def measure(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    info = bench.stack.info
    pid = bench.stack.pids()["api"]
    host, port = urlsplit(info.api_url).hostname or "127.0.0.1", urlsplit(info.api_url).port
    assert port is not None
    await live(bench, args.jobs, TIMEOUT_S)  # the log the readers replay
    log_last = await bench.positions.stream_last()
    await asyncio.sleep(2.0)
    before = rss_mb(pid)
    consumers = int((await bench.nc.jetstream().stream_info(EVENTS_STREAM)).state.consumer_count)
    samples: list[float] = []
    sampler = asyncio.create_task(sampled(pid, args.hold_s + 60.0, samples))
    started = time.monotonic()
    sockets = [
        await asyncio.to_thread(slow_reader, host, port, info.token) for _ in range(args.readers)
    ]
    opened = await streams_opened(bench, consumers, args.readers, 120.0)
    opened_s = time.monotonic() - started
    held_from = time.monotonic()
    if args.live_jobs:
        await live(bench, args.live_jobs, TIMEOUT_S)  # events at the live edge meanwhile
    await asyncio.sleep(max(0.0, args.hold_s - (time.monotonic() - held_from)))
    during_peak = max(samples)
    at_hold = rss_mb(pid)
    outcomes = await asyncio.gather(*(leftover(s, 5.0) for s in sockets))
    reading_peak = max(samples)
    for sock in sockets:
        sock.close()
    await asyncio.sleep(args.settle_s)
    sampler.cancel()
    after = rss_mb(pid)
    return {
        "readers": args.readers,
        "rcvbuf": RCVBUF,
        "log_events": log_last,
        "live_jobs": args.live_jobs,
        "hold_s": args.hold_s,
        "max_streams_per_user": os.environ.get(MAX_STREAMS_ENV, "default"),
        "consumers_opened": opened,
        "opened_in_s": round(opened_s, 1),
        "rss_mb_before": before,
        "rss_mb_peak_during": during_peak,
        "rss_mb_at_end_of_hold": at_hold,
        "rss_mb_peak_while_they_read_what_was_left": reading_peak,
        "rss_mb_after_close": after,
        "refused_429": sum(1 for *_, refused in outcomes if refused),
        "told_lagged": sum(1 for lagged, *_ in outcomes if lagged),
        "stream_ended_by_api": sum(1 for _, ended, *_ in outcomes if ended),
        "bytes_left_per_reader_max": max(n for _, _, n, _ in outcomes),
    }


async def main_async(args: argparse.Namespace, stack: BenchStack) -> dict[str, Any]:
    async with open_bench(stack, 1.0) as bench:
        return await measure(bench, args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--readers", type=int, default=500)
    parser.add_argument("--jobs", type=int, default=5000, help="lifecycles in the log first")
    parser.add_argument("--live-jobs", type=int, default=500, help="lifecycles while held")
    parser.add_argument("--hold-s", type=float, default=30.0, help="how long nobody reads")
    parser.add_argument("--settle-s", type=float, default=10.0, help="after the close")
    parser.add_argument("--max-streams", type=int, help="the api's per-user stream limit")
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    args = parser.parse_args(argv)
    if args.max_streams:
        os.environ[MAX_STREAMS_ENV] = str(args.max_streams)  # the api inherits it
    root = Path(tempfile.mkdtemp(prefix="lode-sse-slow-"))
    root.chmod(0o711)  # Postgres runs as its own account when we are root
    stack = BenchStack(root)
    record: dict[str, Any] = {"date": datetime.now(UTC).isoformat(), "machine": machine_facts()}
    try:
        stack.start()
        record["sse_slow"] = asyncio.run(main_async(args, stack))
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    finally:
        stack.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"sse-slow-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    out.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(json.dumps(record["sse_slow"], indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
