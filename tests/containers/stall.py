"""How long appends to EVENTS stall while the cluster elects a new stream leader.

A probe publishes to the stream every few milliseconds with an expectation that cannot
hold (``Nats-Expected-Last-Sequence: 1``): only the stream's leader can refuse it, and a
refusal stores nothing. The longest gap between two answers is how long no append could
have been stored.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from dataclasses import dataclass, field

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.errors import APIError, NoStreamResponseError

PROBE_EVERY_S = 0.02
PROBE_TIMEOUT_S = 0.5
WRONG_LAST_SEQUENCE = 10071


@dataclass
class StallProbe:
    js: JetStreamContext
    site: str
    answers: list[float] = field(default_factory=list)
    unanswered: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            subject = f"evt.{self.site}.job.{uuid.uuid4()}.probed"
            headers = {"Nats-Expected-Last-Sequence": "1"}
            try:
                await self.js.publish(subject, b"{}", headers=headers, timeout=PROBE_TIMEOUT_S)
            except (NatsTimeoutError, NoRespondersError, NoStreamResponseError, TimeoutError):
                self.unanswered += 1  # no leader (election), or the node we talk to is gone
            except APIError as exc:
                if exc.err_code == WRONG_LAST_SEQUENCE:
                    self.answers.append(time.monotonic())
                else:
                    self.unanswered += 1
            else:
                raise AssertionError("a probe was stored: the stream ignored its expectation")
            await asyncio.sleep(PROBE_EVERY_S)

    def longest_gap_after(self, t: float) -> float:
        """Seconds from ``t`` (the kill) to the answer that ended the longest silence after it."""
        before = [a for a in self.answers if a <= t]
        after = [a for a in self.answers if a > t]
        if not after:
            return float("inf")
        points = [before[-1] if before else t, *after]
        return max(b - a for a, b in itertools.pairwise(points))
