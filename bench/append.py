"""Pipelined appends (``publish_async``) of pre-encoded events, with an honest count of acks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client
from nats.js.api import PubAck

from bench.stack import BenchError
from bench.workload import Outgoing
from lodestream.eventlog import JetStream, jetstream

# Acks in flight: enough to keep nats-server busy, bounded so memory stays flat.
WINDOW = 20_000


@dataclass(slots=True)
class AppendStats:
    events: int = 0
    payload_bytes: int = 0
    seconds: float = 0.0
    errors: int = 0
    first_error: str | None = None
    last_seq: int = 0

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    def add(self, other: AppendStats) -> None:
        self.events += other.events
        self.payload_bytes += other.payload_bytes
        self.seconds += other.seconds
        self.errors += other.errors
        self.first_error = self.first_error or other.first_error
        self.last_seq = max(self.last_seq, other.last_seq)

    def to_json(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "seconds": round(self.seconds, 3),
            "events_per_s": round(self.rate),
            "mb_per_s": round(self.payload_bytes / 1e6 / self.seconds, 1) if self.seconds else 0,
            "avg_payload_bytes": round(self.payload_bytes / self.events) if self.events else 0,
            "errors": self.errors,
            "first_error": self.first_error,
        }


@dataclass(slots=True)
class Appender:
    """One JetStream context with a large async window (nats-py's default is 4,000)."""

    js: JetStream
    stats: AppendStats = field(default_factory=AppendStats)

    @classmethod
    def over(cls, nc: Client) -> Appender:
        # lodestream's context: publish_async puts refusals on the future (nats.py#985),
        # so an error cannot leave publish_async_completed() waiting forever.
        return cls(jetstream(nc, publish_async_max_pending=WINDOW))

    async def append(self, items: Iterable[Outgoing], timeout_s: float) -> AppendStats:
        """Append ``items`` in order and wait for every ack; stats of this call only."""
        stats = AppendStats()

        def done(future: asyncio.Future[PubAck]) -> None:
            if future.cancelled():
                return
            error = future.exception()
            if error is not None:
                stats.errors += 1
                stats.first_error = stats.first_error or repr(error)
            else:
                stats.last_seq = max(stats.last_seq, future.result().seq)

        started = time.perf_counter()
        try:
            async with asyncio.timeout(timeout_s):
                for subject, payload, headers in items:
                    future = await self.js.publish_async(subject, payload, headers=headers)
                    future.add_done_callback(done)
                    stats.events += 1
                    stats.payload_bytes += len(payload)
                await self.js.publish_async_completed()
        except TimeoutError as exc:
            raise BenchError(
                f"appending: {stats.events} sent, {self.js.publish_async_pending()} acks "
                f"missing after {timeout_s:.0f}s"
            ) from exc
        stats.seconds = time.perf_counter() - started
        self.stats.add(stats)
        return stats
