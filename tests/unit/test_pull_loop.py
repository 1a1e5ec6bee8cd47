"""The one fetch-and-retry loop of the consumers, driven by a scripted consumer (no server).

What the real consumers do with it is tested against nats-server in tests/integration;
here are the loop's own rules: a timeout is an empty batch, a transient failure (the one
classifier, :func:`lodestream.eventlog.transient.transient`) is logged and skipped, any
other error is the caller's, and empty batches are not handed on. What a failed delivery
means is the consumer kernel's (tests/unit/test_consumer_kernel.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import nats.errors
import pytest
from nats.aio.msg import Msg

from lodestream.eventlog.pull import PullConsumer, PullLoop


@dataclass
class Scripted:
    """Answers each ``fetch`` with the next entry: a list of messages or an exception."""

    script: list[list[Any] | BaseException]
    sizes: list[int] = field(default_factory=list)
    timeouts: list[float] = field(default_factory=list)

    async def fetch(self, batch: int, timeout: float) -> list[Any]:  # noqa: ASYNC109 - as PullConsumer
        self.sizes.append(batch)
        self.timeouts.append(timeout)
        answer = self.script.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


@dataclass(frozen=True)
class FakeMsg:
    subject: str


def loop_over(scripted: Scripted, **kwargs: Any) -> PullLoop[Msg]:
    options: dict[str, Any] = {"name": "test", "batch": 10, "timeout_s": 0.01}
    options.update(kwargs)
    return PullLoop(cast(PullConsumer, scripted), retry_after_s=0.0, **options)


async def collect(pulling: PullLoop[Msg], rounds: int) -> list[list[Any]]:
    batches: list[list[Any]] = []

    async def handle(msgs: list[Msg]) -> None:
        batches.append(list(msgs))

    for _ in range(rounds):
        await pulling.once(handle)
    return batches


async def test_timeouts_and_ridden_out_errors_are_empty_batches_never_handed_on() -> None:
    one, two = FakeMsg("a"), FakeMsg("b")
    scripted = Scripted(
        [
            TimeoutError(),
            nats.errors.TimeoutError(),
            nats.errors.ConnectionClosedError(),
            [],  # e.g. only a status message came
            [one, two],
        ]
    )
    assert await collect(loop_over(scripted), 5) == [[one, two]]


async def test_the_batch_size_is_asked_before_every_fetch() -> None:
    room = iter([3, 1])
    scripted = Scripted([[], []])
    batch: Callable[[], int] = lambda: next(room)  # noqa: E731
    await collect(loop_over(scripted, batch=batch), 2)
    assert scripted.sizes == [3, 1]


async def test_the_wait_is_asked_before_every_fetch_too() -> None:
    waits = iter([0.2, 0.3])
    scripted = Scripted([[], []])
    await collect(loop_over(scripted, timeout_s=lambda: next(waits)), 2)
    assert scripted.timeouts == [0.2, 0.3]


async def test_an_error_it_does_not_ride_out_is_the_callers() -> None:
    scripted = Scripted([ValueError("a bug in the reader")])
    with pytest.raises(ValueError, match="a bug"):
        await collect(loop_over(scripted), 1)


async def test_every_nats_error_is_ridden_out() -> None:
    scripted = Scripted([nats.errors.OutboundBufferLimitError(), [FakeMsg("a")]])
    assert len(await collect(loop_over(scripted), 2)) == 1


async def test_run_stops_on_the_event() -> None:
    stop = asyncio.Event()
    seen: list[Any] = []

    async def handle(msgs: list[Msg]) -> None:
        seen.extend(msgs)
        stop.set()

    scripted = Scripted([[FakeMsg("a")], [FakeMsg("never fetched")]])
    await loop_over(scripted).run(handle, stop)
    assert seen == [FakeMsg("a")]
    assert len(scripted.script) == 1
