"""The rule that tells a revoked site credential from a refusal that passes."""

from __future__ import annotations

import nats.errors
import pytest

from lodestream.agents.site.credential import (
    MIN_REFUSALS,
    CredentialRevoked,
    CredentialWatch,
    is_refusal,
)

# How nats-py reports the server's refusal: on a (re)connect, and from its read loop.
ON_CONNECT = nats.errors.Error("nats: 'Authorization Violation'")
IN_READ_LOOP = nats.errors.AuthorizationError()
# What else a connection reports while it cannot get in.
OTHERS = [
    nats.errors.UnexpectedEOF(),
    nats.errors.Error("nats: empty response from server when expecting INFO message"),
    ConnectionRefusedError(111, "Connect call failed"),
    nats.errors.Error('nats: permissions violation for publish to "evt.beta.job.x.started"'),
]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def watch(after_s: float = 10.0) -> tuple[CredentialWatch, Clock, list[str]]:
    clock = Clock()
    calls: list[str] = []
    w = CredentialWatch("alpha", after_s=after_s, clock=clock,
                        on_revoked=lambda: calls.append("revoked"))  # fmt: skip
    return w, clock, calls


def refuse_every(w: CredentialWatch, clock: Clock, seconds: float, step: float = 0.5) -> None:
    end = clock.now + seconds
    while clock.now <= end and not w.revoked:
        w.observe(ON_CONNECT)
        clock.now += step


def test_both_wordings_are_refusals_and_nothing_else_is() -> None:
    assert is_refusal(ON_CONNECT)
    assert is_refusal(IN_READ_LOOP)
    assert not any(is_refusal(exc) for exc in OTHERS)


def test_a_refusal_that_lasts_is_a_revocation_once() -> None:
    w, clock, calls = watch(after_s=10)
    refuse_every(w, clock, 9.5)
    assert not w.revoked
    refuse_every(w, clock, 5)
    assert w.revoked
    assert calls == ["revoked"]
    w.observe(ON_CONNECT)  # decided for good: told once
    w.connected()
    assert w.revoked
    assert calls == ["revoked"]
    error = w.error()
    assert isinstance(error, CredentialRevoked)
    assert "alpha" in str(error)
    assert "revoked" in str(error)


def test_getting_in_again_forgives_every_refusal_before() -> None:
    w, clock, calls = watch(after_s=10)
    for _ in range(5):  # a reload, again and again: each refusal streak ends in time
        refuse_every(w, clock, 8)
        w.connected()
        clock.now += 60
    assert not w.revoked
    assert calls == []


def test_other_errors_neither_count_nor_forgive() -> None:
    w, clock, _ = watch(after_s=10)
    for _ in range(40):
        for exc in OTHERS:
            w.observe(exc)
        clock.now += 1
    assert not w.revoked
    w.observe(ON_CONNECT)
    for _ in range(15):
        for exc in OTHERS:
            w.observe(exc)  # e.g. a websocket dropped between refusals
        w.observe(IN_READ_LOOP)
        clock.now += 1
    assert w.revoked


def test_one_refusal_on_each_side_of_a_long_outage_is_no_streak() -> None:
    w, clock, _ = watch(after_s=10)
    w.observe(ON_CONNECT)
    clock.now += 600  # NATS down: connection refused, which does not count
    w.observe(ON_CONNECT)
    assert not w.revoked  # two refusals, however far apart, are not enough
    for _ in range(MIN_REFUSALS - 2):
        w.observe(ON_CONNECT)
    assert w.revoked  # ... but refused on every attempt that reached the server


@pytest.mark.parametrize("after_s", [1.0, 30.0])
def test_fast_refusals_wait_for_the_time_too(after_s: float) -> None:
    w, clock, _ = watch(after_s=after_s)
    for _ in range(100):
        w.observe(ON_CONNECT)  # a burst, all at one instant
    assert not w.revoked
    clock.now += after_s
    w.observe(ON_CONNECT)
    assert w.revoked
