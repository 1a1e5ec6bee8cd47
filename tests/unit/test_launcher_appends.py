"""Which failed appends a pilot tries again, and that a retry returns what finally landed."""

from __future__ import annotations

import math

import pytest
from nats.js.errors import APIError, ServiceUnavailableError

from lodestream.agents.launcher.appends import append_patiently
from lodestream.eventlog import AppendError, ConflictError
from lodestream.eventlog.append import Appended
from lodestream.eventlog.transient import transient
from lodestream.schemas.envelope import Event
from tests.support.builders import job_created


def refused(err_code: int, description: str, code: int = 400) -> AppendError:
    try:
        raise APIError(code=code, err_code=err_code, description=description)
    except APIError as exc:
        error = AppendError(f"JetStream refused: {description}")
        error.__cause__ = exc
        return error


def unavailable() -> AppendError:
    error = AppendError("JetStream unavailable")
    error.__cause__ = ServiceUnavailableError(code=503, description="unavailable")
    return error


@pytest.mark.parametrize(
    ("exc", "again"),
    [
        (AppendError("no acknowledgement: TimeoutError()"), True),
        (unavailable(), True),
        (refused(10158, "duplicate message id is in process", code=409), True),
        (refused(10164, "wrong last sequence"), True),  # clustered: the aggregate in process
        (TimeoutError(), True),
        (ConflictError("evt.alpha.job.x.started", 3, 4, "wrong last sequence"), False),
        (refused(10060, "expected stream does not match"), False),
        (refused(10077, "maximum payload exceeded"), False),
        (ValueError("a bug"), False),
    ],
)
def test_what_is_tried_again(exc: Exception, again: bool) -> None:
    assert transient(exc) is again


class FlakyLog:
    """A double of :class:`EventLog`: fails with the given errors, then appends."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.tries = 0

    async def append(self, event: Event, *, expect: int | None) -> Appended:
        self.tries += 1
        if self.failures:
            raise self.failures.pop(0)
        return Appended(event, 42, duplicate=True)


async def test_a_lease_whose_first_try_is_in_flight_is_tried_until_it_lands() -> None:
    event = job_created("alpha", "ada")
    flaky = FlakyLog(
        AppendError("no acknowledgement: TimeoutError()"),
        refused(10158, "duplicate message id is in process", code=409),
        refused(10164, "wrong last sequence"),
    )
    seq = await append_patiently(
        flaky,  # type: ignore[arg-type]
        event, 7, until=math.inf, gone=lambda: False,
    )  # fmt: skip
    assert (seq, flaky.tries) == (42, 4)


async def test_a_conflict_is_raised_at_once() -> None:
    event = job_created("alpha", "ada")
    flaky = FlakyLog(ConflictError(event.subject, 7, 8, "wrong last sequence"))
    with pytest.raises(ConflictError):
        await append_patiently(
            flaky,  # type: ignore[arg-type]
            event, 7, until=math.inf, gone=lambda: False,
        )  # fmt: skip
    assert flaky.tries == 1
