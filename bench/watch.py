"""Issues 13.1 and 30: the live subscription client, appended → delivered and replay.

    python -m bench.watch [--rate 5 --rate 1000] [--seconds 10] [--sites 1]
                          [--replay 100000] [--out bench/out]

Starts nats-server as the stack runs it (JetStream, TLS websocket, the control plane's
password user, one monitoring key holding site ``alpha``) and measures what
:func:`lodestream.client.watch.watch` sees over wss:// with that key:

* **latency**: a publisher *process* (the control plane's connection, plain listener)
  appends real job events at each ``--rate`` per second for ``--seconds`` (at least
  :data:`SLOW_SECONDS` below 100 per second: enough events for a p95, and several pull
  expiries); each append's ``time.monotonic_ns()`` before the publish is compared with the
  watcher's clock when the event comes out of its iterator (one system-wide monotonic
  clock, two processes). p50 / p95 / p99 / max over every event. With ``--sites N`` the key
  holds N sites, the watcher watches them all and the events go to each in turn.
* **replay**: ``--replay`` events are appended first (pipelined), then a watcher starts at
  ``since=1`` and the time to receive them all is measured, decoding and checking each with
  the shared rule as any watcher does.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import multiprocessing
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from bench.stack import free_port
from lodestream.client.credential import MonitorCredential
from lodestream.client.watch import watch
from lodestream.eventlog import jetstream
from lodestream.eventlog.streams import ensure_streams
from lodestream.infra.nats.auth import CONTROL_USER, new_password, render_authorization
from lodestream.infra.nats.config import NatsServerConfig
from lodestream.infra.nats.monitor import MonitorKey
from lodestream.infra.nats.server import NatsServer
from lodestream.infra.nats.tls import ensure_local_ca
from lodestream.natsconn import connect
from lodestream.schemas.codec import encode
from lodestream.schemas.events import JobCreated, JobPreprocessed, JobStarted
from lodestream.schemas.events.job import StartedData, StepData
from lodestream.schemas.resources import JobSpec
from lodestream.settings import NatsSettings

SITE = "alpha"
SLOW_SECONDS = 60.0


def site_names(count: int) -> tuple[str, ...]:
    return (SITE, *(f"site{i}" for i in range(1, count)))


def job_events(count: int, sites: tuple[str, ...] = (SITE,)) -> list[tuple[str, bytes, str]]:
    """``count`` real events (created, preprocessed, started per job, the jobs at each of
    ``sites`` in turn): subject, body, id."""
    out: list[tuple[str, bytes, str]] = []
    while len(out) < count:
        site = sites[len(out) // 3 % len(sites)]
        job, session = uuid.uuid4(), uuid.uuid4()
        spec = JobSpec.model_validate({"site": site, "app": "demo", "workdir": f"w/{job}"})
        for event in (
            JobCreated.create(site=site, aggregate_id=job, actor="user:ada", data=spec),
            JobPreprocessed.create(site=site, aggregate_id=job, actor="controller:main",
                                   data=StepData(skipped=("job.ready", "job.staged_in"))),
            JobStarted.create(site=site, aggregate_id=job, actor=f"launcher:{session}",
                              data=StartedData(session_id=session, skipped=("job.leased",))),
        ):  # fmt: skip
            out.append((event.subject, encode(event), str(event.id)))
    return out[:count]


async def _publish_paced(
    settings: NatsSettings, rate: int, seconds: float, sites: tuple[str, ...]
) -> dict[str, int]:
    events = job_events(int(rate * seconds), sites)
    nc = await connect(settings)
    js = jetstream(nc)
    sent: dict[str, int] = {}
    tick = 0.01  # a hundred small batches per second, evenly spaced
    per_tick = max(1, int(rate * tick))
    start = time.monotonic()
    try:
        for i in range(0, len(events), per_tick):
            due = start + (i // per_tick) * tick
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            futures = []
            for subject, body, event_id in events[i : i + per_tick]:
                sent[event_id] = time.monotonic_ns()
                futures.append(await js.publish_async(subject, body))
            await asyncio.gather(*futures)
    finally:
        await nc.close()
    return sent


def _publisher(
    settings: dict[str, Any], rate: int, seconds: float, sites: tuple[str, ...], out: Any
) -> None:
    settings["password"] = SecretStr(settings["password"])
    sent = asyncio.run(_publish_paced(NatsSettings.model_validate(settings), rate, seconds, sites))
    out.put(sent)


def _plain(settings: NatsSettings) -> dict[str, Any]:
    """``settings`` for another process, the password in clear (it is the bench's own)."""
    plain = settings.model_dump(mode="json")
    plain["password"] = settings.password.get_secret_value() if settings.password else None
    return plain


async def _watch_count(
    credential: MonitorCredential, since: Any, count: int, sites: tuple[str, ...] = (SITE,)
) -> dict[str, int]:
    got: dict[str, int] = {}
    async with watch(credential, sites, since=since) as w:
        async for item in w:
            got[str(item.event.id)] = time.monotonic_ns()
            if len(got) == count:
                break
    return got


async def latency(settings: NatsSettings, cred: MonitorCredential, rate: int, seconds: float,
                  sites: tuple[str, ...]) -> dict[str, Any]:  # fmt: skip
    if rate < 100:
        seconds = max(seconds, SLOW_SECONDS)
    count = int(rate * seconds)
    receiver = asyncio.create_task(_watch_count(cred, "now", count, sites))
    await asyncio.sleep(1.0)  # the watcher's consumer exists before the first append
    queue: Any = multiprocessing.get_context("spawn").Queue()
    proc = multiprocessing.get_context("spawn").Process(
        target=_publisher, args=(_plain(settings), rate, seconds, sites, queue)
    )
    proc.start()
    done, _ = await asyncio.wait({receiver}, timeout=seconds * 3 + 60)
    if not done:
        receiver.cancel()
        proc.kill()
        raise RuntimeError(f"the watcher did not receive {count} events in time")
    got = receiver.result()
    sent = await asyncio.to_thread(queue.get, True, 120)
    proc.join()
    ms = sorted((got[k] - sent[k]) / 1e6 for k in sent)
    cut = statistics.quantiles(ms, n=100)
    return {"events": len(ms), "rate_per_s": rate, "sites": len(sites),
            "p50_ms": round(cut[49], 2),
            "p95_ms": round(cut[94], 2), "p99_ms": round(cut[98], 2),
            "max_ms": round(ms[-1], 2)}  # fmt: skip


async def replay(settings: NatsSettings, cred: MonitorCredential, count: int) -> dict[str, Any]:
    nc = await connect(settings)
    js = jetstream(nc)
    first = (await js.stream_info("EVENTS")).state.last_seq + 1
    events = job_events(count)
    for i in range(0, count, 1000):
        futures = [await js.publish_async(s, b) for s, b, _ in events[i : i + 1000]]
        await asyncio.gather(*futures)
    await nc.close()
    start = time.perf_counter()
    got = await _watch_count(cred, first, count)
    seconds = time.perf_counter() - start
    return {"events": len(got), "seconds": round(seconds, 2),
            "events_per_s": round(len(got) / seconds)}  # fmt: skip


async def main_async(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    password = new_password()
    tls = ensure_local_ca(root / "tls")
    cred0 = MonitorCredential.new("wss://placeholder", tls.ca_cert)
    sites = site_names(args.sites)
    config = NatsServerConfig(
        server_name="bench-watch", store_dir=root / "store", client_port=free_port(),
        http_port=free_port(), websocket_port=free_port(), tls=tls,
        authorization=render_authorization(
            CONTROL_USER, password, {}, [MonitorKey("ada", cred0.public_key, sites)]
        ),
    )  # fmt: skip
    server = NatsServer(config, root / "nats")
    server.start()
    try:
        cred = dataclasses.replace(cred0, nats_url=server.websocket_url)
        settings = NatsSettings(
            url=server.client_url, user=CONTROL_USER, password=SecretStr(password)
        )
        nc = await connect(settings)
        await ensure_streams(jetstream(nc), heartbeat_ttl_s=10)
        await nc.close()
        return {
            "latency": [
                await latency(settings, cred, rate, args.seconds, sites)
                for rate in args.rate or [5, 1000]
            ],
            "replay": await replay(settings, cred, args.replay),
        }
    finally:
        server.stop()


def main() -> None:
    from bench.report import machine_facts  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=int, action="append", help="events/s (repeat); 5, 1000")
    parser.add_argument("--sites", type=int, default=1, help="sites watched, events to each")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--replay", type=int, default=100_000)
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-watch-") as tmp:
        figures = asyncio.run(main_async(args, Path(tmp)))
    record = {"bench": "watch", "at": datetime.now(UTC).isoformat(),
              "args": vars(args) | {"out": str(args.out)}, "machine": machine_facts(),
              **figures}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"watch-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(record, indent=2))
    print(json.dumps(figures, indent=2))
    print(f"record: {path}")


if __name__ == "__main__":
    main()
