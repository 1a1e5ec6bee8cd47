"""What an ack costs (issue 15, lever 3): explicit ack of each message vs one AckAll per batch.

    python -m bench.acks [--messages 40000] [--batch 256]

Starts a nats-server on loopback, fills a stream, and drains it twice per policy through
the consumers' own :class:`PullConsumer`: acking every message (``AckPolicy.EXPLICIT``,
what the controller does) and acking the last of each batch (``AckPolicy.ALL``, what the
projector does). Prints, per delivered message, the client's CPU spent in acks, the
client's whole CPU, and nats-server's CPU (from /proc). Process CPU, not wall time, but
the machine is shared: compare the policies within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StreamConfig

from bench.stack import free_port
from lodestream.eventlog.pull import PullConsumer
from lodestream.infra.nats.config import NatsServerConfig
from lodestream.infra.nats.server import NatsServer

PAYLOAD = b"x" * 400  # about an encoded lifecycle event


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def drain(
    js: Any, policy: AckPolicy, name: str, total: int, batch: int, server: int
) -> dict[str, float]:
    await js.add_consumer("ACKS", ConsumerConfig(
        durable_name=name, ack_policy=policy, deliver_policy=DeliverPolicy.ALL,
        ack_wait=60, max_ack_pending=total,
    ))  # fmt: skip
    sub = await PullConsumer.on(js, "ACKS", name).start()
    got, acking = 0, 0.0
    server_start, client_start = process_cpu_s(server), time.process_time()
    while got < total:
        msgs = await sub.fetch(batch, timeout=2.0)
        got += len(msgs)
        started = time.process_time()
        if policy == AckPolicy.ALL:
            await msgs[-1].ack()
        else:
            for msg in msgs:
                await msg.ack()
        acking += time.process_time() - started
    await js._nc.flush()
    while (await js.consumer_info("ACKS", name)).num_ack_pending:  # noqa: ASYNC110 - polling the server
        await asyncio.sleep(0.05)  # until it has taken every ack: its CPU for them is spent
    client, served = time.process_time() - client_start, process_cpu_s(server) - server_start
    await sub.stop()
    return {"client_ack_us": acking / total * 1e6, "client_us": client / total * 1e6,
            "server_us": served / total * 1e6}  # fmt: skip


async def measure(total: int, batch: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-acks-"))
    config = NatsServerConfig(server_name="acks", store_dir=root / "store", client_port=free_port())
    server = NatsServer(config, root)
    server.start()
    try:
        nc = await nats.connect(f"nats://127.0.0.1:{config.client_port}")
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="ACKS", subjects=["acks.>"]))
        for i in range(total):
            await js.publish(f"acks.{i % 100}", PAYLOAD)
        print(
            f"{'policy':10}{'client ack µs':>15}{'client µs':>12}{'server µs':>12}  (per message)"
        )
        for round_ in range(2):
            for policy in (AckPolicy.EXPLICIT, AckPolicy.ALL):
                pid = server.pid
                assert pid is not None
                row = await drain(js, policy, f"{policy.value}{round_}", total, batch, pid)
                print(f"{policy.value:10}{row['client_ack_us']:>15.2f}{row['client_us']:>12.2f}"
                      f"{row['server_us']:>12.2f}")  # fmt: skip
        await nc.close()
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=40_000)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    asyncio.run(measure(args.messages, args.batch))


if __name__ == "__main__":
    main()
