"""When a job that failed its run may run again: bounded exponential backoff with jitter.

The wait before attempt ``n + 1``, after attempt ``n`` failed, is

    ceiling = min(max_s, base_s * factor ** (n - 1))
    wait    = ceiling * (1 - jitter * u),    u in [0, 1)

so it never exceeds ``max_s`` and never falls below ``(1 - jitter) * ceiling``.
``u`` is not random: it is read from a hash of the job id and the attempt, so
whoever decides again (a redelivery, a restarted site agent, a test) gets the
same wait, while jobs that failed together still spread out instead of
coming back in lockstep. Everything here is pure.
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime, timedelta
from typing import Final, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_BACKOFF_S: Final = 86_400.0  # a day: longer than any retry wait worth keeping a job for
MAX_FACTOR: Final = 16.0
_EXPONENT_CAP: Final = 64  # beyond it every ceiling is max_s anyway; keeps the float finite
_UNIT: Final = float(2**64)


class RetryBackoff(BaseModel):
    """How long a failed job waits before its next attempt (``processing.retry_backoff``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_s: float = Field(10.0, ge=0, le=MAX_BACKOFF_S, description="wait after attempt 1")
    factor: float = Field(2.0, ge=1, le=MAX_FACTOR, description="growth per further attempt")
    max_s: float = Field(600.0, ge=0, le=MAX_BACKOFF_S, description="no wait is longer")
    jitter: float = Field(
        0.2, ge=0, le=1, description="fraction a wait may be shortened by, to spread retries"
    )

    @model_validator(mode="after")
    def _base_within_max(self) -> Self:
        if self.base_s > self.max_s:
            raise ValueError(f"base_s ({self.base_s}) is more than max_s ({self.max_s})")
        return self


def jitter_unit(job_id: uuid.UUID, attempt: int) -> float:
    """A number in [0, 1) fixed by the job and the attempt (the same on every machine)."""
    digest = hashlib.sha256(f"{job_id}/{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / _UNIT


def backoff_s(policy: RetryBackoff, job_id: uuid.UUID, failed_attempt: int) -> float:
    """Seconds to wait after ``failed_attempt`` (1 for the first run) failed, to the ms."""
    if failed_attempt < 1:
        raise ValueError(f"attempts count from 1, got {failed_attempt}")
    exponent = min(failed_attempt - 1, _EXPONENT_CAP)
    ceiling = min(policy.max_s, policy.base_s * policy.factor**exponent)
    wait = ceiling * (1.0 - policy.jitter * jitter_unit(job_id, failed_attempt))
    # Milliseconds: what the event shows is what the schedule meant, whatever float noise.
    return round(wait, 3)


def retry_at(failed_at: datetime, wait_s: float) -> datetime:
    """When the next attempt is due: ``wait_s`` after the failure was recorded.

    Counted from the failure event's own time, not from when the site decided,
    so deciding again yields the same instant.
    """
    return failed_at + timedelta(seconds=wait_s)
