"""The retry schedule: bounded, jittered within its range, the same whoever decides it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from lodestream.schemas.retry import (
    MAX_BACKOFF_S,
    RetryBackoff,
    backoff_s,
    jitter_unit,
    retry_at,
)

JOBS = [uuid.UUID(int=n) for n in range(1, 2001)]
JOB = JOBS[0]


def ceiling(policy: RetryBackoff, attempt: int) -> float:
    return min(policy.max_s, policy.base_s * policy.factor ** (attempt - 1))


def test_without_jitter_waits_grow_by_the_factor_up_to_the_cap() -> None:
    policy = RetryBackoff(base_s=10, factor=2, max_s=60, jitter=0)
    waits = [backoff_s(policy, JOB, attempt) for attempt in range(1, 7)]
    assert waits == [10, 20, 40, 60, 60, 60]


def test_defaults_are_ten_seconds_doubling_up_to_ten_minutes() -> None:
    assert RetryBackoff() == RetryBackoff(base_s=10, factor=2, max_s=600, jitter=0.2)


@pytest.mark.parametrize("attempt", [1, 2, 3, 5, 8, 40, 100])
@pytest.mark.parametrize("jitter", [0.0, 0.2, 0.5, 1.0])
def test_every_wait_lies_within_its_jitter_range_and_under_the_cap(
    attempt: int, jitter: float
) -> None:
    policy = RetryBackoff(base_s=2, factor=3, max_s=300, jitter=jitter)
    top = ceiling(policy, attempt)
    for job in JOBS[:200]:
        wait = backoff_s(policy, job, attempt)
        assert (1 - jitter) * top - 0.0005 <= wait <= top + 0.0005
        assert wait <= policy.max_s


def test_jitter_spreads_jobs_that_failed_together_over_the_whole_range() -> None:
    policy = RetryBackoff(base_s=100, factor=2, max_s=1000, jitter=0.5)
    waits = [backoff_s(policy, job, 1) for job in JOBS]
    assert min(waits) < 52  # both ends of [50, 100] are reached
    assert max(waits) > 98
    assert len(set(waits)) > len(JOBS) // 2  # not a handful of values
    # Roughly uniform: each fifth of the range holds about a fifth of the jobs.
    fifths = [sum(50 + 10 * k <= w < 60 + 10 * k for w in waits) for k in range(5)]
    assert all(300 < n < 500 for n in fifths), fifths


def test_the_same_job_and_attempt_always_wait_the_same() -> None:
    policy = RetryBackoff(jitter=0.7)
    assert [backoff_s(policy, JOB, a) for a in range(1, 5)] == [
        backoff_s(RetryBackoff(jitter=0.7), uuid.UUID(str(JOB)), a) for a in range(1, 5)
    ]
    # The unit is a hash (sha256 of "<job id>/<attempt>"), not Python's per-process hash()
    # or a random draw, so another process, machine or release decides the same: pinned.
    assert jitter_unit(JOB, 1) == pytest.approx(0.6683516232846055)
    assert backoff_s(RetryBackoff(), JOB, 1) == 8.663  # 10 s * (1 - 0.2 * 0.668…)
    assert jitter_unit(JOB, 1) != jitter_unit(JOB, 2)
    assert jitter_unit(JOBS[0], 1) != jitter_unit(JOBS[1], 1)


def test_doubling_waits_never_shrink_with_jitter_up_to_one_half() -> None:
    # A wait jittered down by half is still no shorter than the full wait before it.
    policy = RetryBackoff(base_s=1, factor=2, max_s=1000, jitter=0.5)
    for job in JOBS[:200]:
        waits = [backoff_s(policy, job, a) for a in range(1, 10)]
        assert waits == sorted(waits)


def test_huge_attempts_and_factors_stay_finite_and_capped() -> None:
    policy = RetryBackoff(base_s=MAX_BACKOFF_S, factor=16, max_s=MAX_BACKOFF_S, jitter=0)
    assert backoff_s(policy, JOB, 2**31 - 1) == MAX_BACKOFF_S


def test_zero_base_turns_the_backoff_off() -> None:
    assert backoff_s(RetryBackoff(base_s=0, jitter=0.5), JOB, 3) == 0


def test_attempts_count_from_one() -> None:
    with pytest.raises(ValueError, match="count from 1"):
        backoff_s(RetryBackoff(), JOB, 0)


def test_retry_at_counts_from_the_failure_not_from_now() -> None:
    failed = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert retry_at(failed, 12.5) == failed + timedelta(seconds=12.5)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"base_s": -1}, "greater than or equal to 0"),
        ({"factor": 0.5}, "greater than or equal to 1"),
        ({"factor": 17}, "less than or equal to 16"),
        ({"max_s": MAX_BACKOFF_S + 1}, "less than or equal to 86400"),
        ({"jitter": 1.5}, "less than or equal to 1"),
        ({"base_s": 60, "max_s": 30}, "base_s \\(60.0\\) is more than max_s \\(30.0\\)"),
        ({"base": 1}, "Extra inputs are not permitted"),
    ],
)
def test_a_policy_out_of_bounds_is_refused(fields: dict[str, float], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        RetryBackoff.model_validate(fields)
