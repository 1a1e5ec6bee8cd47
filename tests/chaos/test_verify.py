"""The chaos test's rule for a second run, checked on histories written by hand."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from lodestream.schemas.envelope import Event
from lodestream.schemas.events import JobRestartReady, JobRunErrored, JobRunTimedOut, JobStarted
from lodestream.schemas.events.job import RetryData, RunResultData, StartedData
from tests.chaos.verify import LogEvent, early_starts, unexplained_reruns
from tests.support.builders import job_created, lifecycle

A, B = uuid.uuid4(), uuid.uuid4()


def history(*after_first_start: Event) -> list[LogEvent]:
    created = job_created("alpha", "ada")
    preprocessed, started = lifecycle(created, A)[:2]
    events = [created, preprocessed, started, *after_first_start]
    return [LogEvent(seq, event) for seq, event in enumerate(events, start=1)]


def started(session: uuid.UUID, attempt: int = 2) -> JobStarted:
    return JobStarted.create(
        site="alpha", aggregate_id=uuid.uuid4(), actor=f"launcher:{session}",
        data=StartedData(session_id=session, attempt=attempt),
    )  # fmt: skip


def timed_out(actor: str, *cause: str) -> JobRunTimedOut:
    return JobRunTimedOut.create(
        site="alpha", aggregate_id=uuid.uuid4(), actor=actor, data=RunResultData(cause=cause)
    )


def restart_ready(due: datetime | None = None) -> JobRestartReady:
    return JobRestartReady.create(
        site="alpha", aggregate_id=uuid.uuid4(), actor="site:alpha",
        data=RetryData(attempt=2, retry_at=due),
    )  # fmt: skip


def test_one_start_needs_no_explanation() -> None:
    assert unexplained_reruns(history()) == []


def test_a_second_start_straight_after_the_first_is_reported() -> None:
    [problem] = unexplained_reruns(history(started(B)))
    assert "started again after only []" in problem


def test_the_controller_timing_out_the_first_session_explains_a_second_start() -> None:
    fenced = timed_out("controller:main", f"session {A} heartbeat expired")
    assert unexplained_reruns(history(fenced, restart_ready(), started(B))) == []


def test_the_first_pilot_draining_its_run_explains_a_second_start() -> None:
    assert unexplained_reruns(history(timed_out(f"launcher:{A}"), started(B))) == []


def test_a_timeout_of_another_session_does_not_explain_it() -> None:
    fenced = timed_out("controller:main", f"session {B} heartbeat expired")
    assert len(unexplained_reruns(history(fenced, restart_ready(), started(B)))) == 1


def test_an_error_and_its_retry_are_no_fault_s_doing() -> None:
    # The chaos app cannot fail: a run that errored is a finding, not an explanation.
    errored = JobRunErrored.create(
        site="alpha", aggregate_id=uuid.uuid4(), actor=f"launcher:{A}",
        data=RunResultData(return_code=1),
    )  # fmt: skip
    assert len(unexplained_reruns(history(errored, restart_ready(), started(B)))) == 1


def test_a_start_before_its_retry_was_due_is_reported() -> None:
    fenced = timed_out("controller:main", f"session {A} heartbeat expired")
    soon = datetime.now(UTC) + timedelta(hours=1)
    [problem] = early_starts(history(fenced, restart_ready(soon), started(B)))
    assert "early" in problem
    past = datetime.now(UTC) - timedelta(seconds=1)
    assert early_starts(history(fenced, restart_ready(past), started(B))) == []
    assert early_starts(history(fenced, restart_ready(), started(B))) == []
