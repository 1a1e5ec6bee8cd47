"""What a job's run came to, folded from its events: the one rule the API and the SDK share.

The API's ``/jobs/{id}/result`` folds a job's history with it; the SDK's executor folds the
live feed with it, event by event, so a future and the API never disagree about a job.

A job's outcome is the newest run it reported (``job.run_done``, ``job.run_errored``,
``job.run_timed_out``, or ``job.finished`` when it finished at the end of its run) and its
state. A Python-function app's return value is the run's ``result``; when ``run()`` raised,
the run's ``stderr_tail`` is the traceback pyrun wrote, whose last line names the exception.
A job that was reset starts over: what an earlier attempt reported is kept until a newer
run replaces it, but the job is not final again until it ends again.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from lodestream.schemas.states import FINAL, JobState

RUN_EVENTS: Final = frozenset({"job.run_done", "job.run_errored", "job.run_timed_out"})
ENDING_EVENTS: Final = frozenset({"job.finished", "job.failed", "job.killed"})
# The events a result is folded from; a reader may ask for these alone.
RESULT_EVENTS: Final = RUN_EVENTS | ENDING_EVENTS | {"job.reset", "job.restart_ready"}
# `ValueError: bad input` or `pkg.mod.Error: message`, the last line Python prints.
_EXCEPTION_LINE: Final = re.compile(r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$")


@dataclass(frozen=True, slots=True)
class RemoteError:
    """The exception a Python-function app's ``run()`` raised, as pyrun reported it."""

    type: str
    message: str
    traceback: str


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """A job's outcome so far; ``final`` once it is JOB_FINISHED, FAILED or KILLED."""

    job_id: str
    state: str | None = None
    result: Any = None
    return_code: int | None = None
    stderr_tail: str = ""
    cause: tuple[str, ...] = ()
    reason: str = ""
    attempt: int = 1
    runs: int = 0

    @property
    def final(self) -> bool:
        return self.state in FINAL

    @property
    def succeeded(self) -> bool:
        return self.state == JobState.JOB_FINISHED

    @property
    def remote_error(self) -> RemoteError | None:
        """The Python exception of the newest run, when its stderr is pyrun's traceback."""
        return remote_error(self.stderr_tail)

    def to_json(self) -> dict[str, Any]:
        error = self.remote_error
        return {
            "job_id": self.job_id, "state": self.state, "final": self.final,
            "result": self.result, "return_code": self.return_code,
            "stderr_tail": self.stderr_tail, "cause": list(self.cause), "reason": self.reason,
            "attempt": self.attempt, "runs": self.runs,
            "error": None if error is None else {
                "type": error.type, "message": error.message, "traceback": error.traceback,
            },
        }  # fmt: skip


def remote_error(stderr_tail: str) -> RemoteError | None:
    """The exception named by a Python traceback's last line, or None if there is none."""
    if "Traceback (most recent call last):" not in stderr_tail:
        return None
    lines = [line for line in stderr_tail.rstrip().splitlines() if line.strip()]
    match = _EXCEPTION_LINE.match(lines[-1]) if lines else None
    if match is None:
        return None
    return RemoteError(match.group(1), (match.group(2) or "").strip(), stderr_tail)


def apply(
    outcome: JobOutcome, event_type: str, data: Mapping[str, Any], to_state: str | None
) -> JobOutcome:
    """``outcome`` after one of its job's events (type, data and the state it led to)."""
    state = to_state if to_state is not None else outcome.state
    if event_type in RUN_EVENTS:
        return _run(outcome, data, state)
    if event_type == "job.finished":
        run = data.get("run")
        if isinstance(run, Mapping):
            return _run(outcome, run, state)
        return replace(outcome, state=state)
    if event_type in {"job.failed", "job.killed"}:
        cause = tuple(str(c) for c in data.get("cause") or ())
        return replace(outcome, state=state, reason=str(data.get("reason", "")),
                       cause=cause or outcome.cause)  # fmt: skip
    if event_type in {"job.reset", "job.restart_ready"}:
        return replace(outcome, state=state, reason="")
    return replace(outcome, state=state)


def fold(job_id: str, events: Iterable[Mapping[str, Any]]) -> JobOutcome:
    """A job's outcome from its events in log order, as the API's rows hold them
    (``type``, ``data``, ``to_state``)."""
    outcome = JobOutcome(job_id)
    for event in events:
        outcome = apply(outcome, str(event["type"]), event.get("data") or {}, event.get("to_state"))
    return outcome


def _run(outcome: JobOutcome, data: Mapping[str, Any], state: str | None) -> JobOutcome:
    code = data.get("return_code")
    return replace(
        outcome,
        state=state,
        result=data.get("result"),
        return_code=code if isinstance(code, int) else None,
        stderr_tail=str(data.get("stderr_tail", "")),
        cause=tuple(str(c) for c in data.get("cause") or ()),
        attempt=int(data.get("attempt", outcome.attempt) or outcome.attempt),
        runs=outcome.runs + 1,
    )
