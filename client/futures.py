"""A job's future, and what it resolves to: a Python app's return value, a shell app's
:class:`JobResult`, or :class:`JobFailed`.

A :class:`LodeFuture` stays *pending* until its job is final (``running()`` says whether the
job has started), so ``cancel()`` works as the standard library's does on a pending future;
here it also kills the job, running or not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from lodestream.schemas.results import JobOutcome, RemoteError
from lodestream.schemas.states import JobState


@dataclass(frozen=True, slots=True)
class JobResult:
    """How a shell app's job ended: its final state, exit code and stderr tail."""

    job_id: str
    state: str
    return_code: int | None
    stderr_tail: str
    workdir: str


class JobFailed(Exception):
    """The job ended FAILED or KILLED. ``remote`` is the exception a Python app's ``run()``
    raised (its type, message and traceback), when that is why."""

    def __init__(self, outcome: JobOutcome) -> None:
        self.outcome = outcome
        self.job_id = outcome.job_id
        self.state = outcome.state
        self.reason = outcome.reason
        self.cause = outcome.cause
        self.return_code = outcome.return_code
        self.stderr_tail = outcome.stderr_tail
        self.remote: RemoteError | None = outcome.remote_error
        super().__init__(self._message())

    def _message(self) -> str:
        parts = [f"job {self.job_id} {self.state}"]
        if self.reason:
            parts.append(self.reason)
        if self.remote is not None:
            parts.append(f"{self.remote.type}: {self.remote.message}")
        elif self.return_code not in (None, 0):
            parts.append(f"exit code {self.return_code}")
        if self.cause:
            parts.append("cause: " + " <- ".join(self.cause))
        return "; ".join(parts)


class CallFailed(Exception):
    """One call of a job of many calls (``LodeExecutor.map`` with a ``chunksize``) raised in
    the app's ``run()``; the job and its other calls are fine. ``remote`` is the exception's
    type, message and traceback as the site reported them."""

    def __init__(self, job_id: str, index: int, remote: RemoteError) -> None:
        self.job_id = job_id
        self.index = index  # the call's place in its job
        self.remote = remote
        super().__init__(f"job {job_id}, call {index}: {remote.type}: {remote.message}")

    @classmethod
    def unreported(cls, job_id: str, index: int) -> CallFailed:
        """The job finished but its result holds no outcome for this call (not pyrun's)."""
        why = "the job's result holds no outcome for this call"
        return cls(job_id, index, RemoteError("ResultError", why, ""))

    @classmethod
    def from_outcome(cls, job_id: str, index: int, outcome: Mapping[str, Any]) -> CallFailed:
        """From one entry of the job's result, as pyrun writes it (``{"ok": false, ...}``)."""
        error = str(outcome.get("error", ""))
        kind, _, message = error.partition(": ")
        traceback = str(outcome.get("traceback", ""))
        return cls(job_id, index, RemoteError(kind or "Exception", message, traceback))


class LodeFuture(Future[Any]):
    """The future of one job; ``job_id`` is set once the API has accepted it."""

    def __init__(self, kill: Callable[[LodeFuture], None]) -> None:
        super().__init__()
        self.job_id: str | None = None
        self.started = False
        self._kill = kill

    def running(self) -> bool:
        """Whether the job has started and not ended (``job.started`` seen on the feed)."""
        return self.started and not self.done()

    def cancel(self) -> bool:
        """Cancel the future and kill its job (a running task is stopped by its pilot).

        False once the job has ended, as for a finished standard future.
        """
        if self.done():
            return self.cancelled()
        self._kill(self)
        if not super().cancel():
            return False
        # A future the standard executors cancel is then told so by their worker; here nothing
        # will run it, so tell it now, or wait() and as_completed() would never see it done.
        self.set_running_or_notify_cancel()
        return True


def resolve(future: LodeFuture, outcome: JobOutcome, *, python: bool, workdir: str) -> None:
    """Settle ``future`` with its job's final ``outcome``; a no-op if it was cancelled."""
    if future.done():
        return
    if outcome.state != JobState.JOB_FINISHED:
        future.set_exception(JobFailed(outcome))
    elif python:
        future.set_result(outcome.result)
    else:
        assert outcome.state is not None
        future.set_result(JobResult(outcome.job_id, outcome.state, outcome.return_code,
                                    outcome.stderr_tail, workdir))  # fmt: skip
