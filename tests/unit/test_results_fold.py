"""The result fold the API's /jobs/{id}/result and the SDK's futures share."""

from __future__ import annotations

from typing import Any

from lodestream.schemas.results import fold, remote_error

TRACEBACK = """Traceback (most recent call last):
  File "/site/apps/square.py", line 9, in run
    raise ValueError(f"negative input {x}")
ValueError: negative input -4
"""


def ev(type_: str, to_state: str | None, **data: Any) -> dict[str, Any]:
    return {"type": type_, "to_state": to_state, "data": data}


def test_a_python_app_finished_at_its_run_end_carries_its_result() -> None:
    outcome = fold("j", [
        ev("job.finished", "JOB_FINISHED", run={"return_code": 0, "result": {"y": 4}}),
    ])  # fmt: skip
    assert (outcome.final, outcome.succeeded, outcome.result, outcome.runs) == (
        True, True, {"y": 4}, 1,
    )  # fmt: skip


def test_a_result_reported_by_run_done_survives_postprocess_and_staging() -> None:
    outcome = fold("j", [
        ev("job.run_done", "RUN_DONE", return_code=0, result=[1, 2]),
        ev("job.postprocessed", "POSTPROCESSED"),
        ev("job.finished", "JOB_FINISHED"),
    ])  # fmt: skip
    assert (outcome.state, outcome.result) == ("JOB_FINISHED", [1, 2])


def test_a_failure_after_retries_keeps_the_last_run_and_the_reason() -> None:
    outcome = fold("j", [
        ev("job.run_errored", "RUN_ERROR", return_code=1, stderr_tail="first", attempt=1),
        ev("job.restart_ready", "RESTART_READY", attempt=2),
        ev("job.run_errored", "RUN_ERROR", return_code=1, stderr_tail=TRACEBACK, attempt=2),
        ev("job.failed", "FAILED", reason="retry budget spent", cause=["run errored"]),
    ])  # fmt: skip
    assert (outcome.final, outcome.succeeded, outcome.attempt, outcome.runs) == (
        True, False, 2, 2,
    )  # fmt: skip
    assert outcome.reason == "retry budget spent"
    assert outcome.cause == ("run errored",)
    error = outcome.remote_error
    assert error is not None
    assert (error.type, error.message) == ("ValueError", "negative input -4")


def test_a_reset_job_is_not_final_until_it_ends_again() -> None:
    outcome = fold("j", [
        ev("job.killed", "KILLED", reason="by hand"),
        ev("job.reset", "READY"),
    ])  # fmt: skip
    assert not outcome.final
    assert outcome.reason == ""


def test_remote_errors_are_read_only_from_a_traceback() -> None:
    assert remote_error("disk full\n") is None
    assert remote_error("") is None
    bare = remote_error("Traceback (most recent call last):\n  ...\nStopIteration\n")
    assert bare is not None
    assert (bare.type, bare.message) == ("StopIteration", "")
    dotted = remote_error("Traceback (most recent call last):\n  ...\npkg.mod.Oops: x: y\n")
    assert dotted is not None
    assert (dotted.type, dotted.message) == ("pkg.mod.Oops", "x: y")
