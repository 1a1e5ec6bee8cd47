"""A fake app launcher for tests that need task outcomes but not real processes.

It passes the same shared test suite as the real backends, within the limits of running nothing:
it writes the configured stdout and stderr to the task's files at start, and exposes the
environment and working directory a real backend would have given the task as ``FakeTask.env``
and ``FakeTask.cwd``. Pass a ``clock`` and ``sleep`` to drive time by hand.
"""

from __future__ import annotations

import itertools
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lodestream.platform_adapters.errors import StartFailed, WaitTimedOut
from lodestream.platform_adapters.launchers.base import (
    DEFAULT_GRACE_S,
    AppLauncher,
    RunningTask,
    TaskSpec,
    render_env,
)
from lodestream.platform_adapters.launchers.local import refuse_launch_params

# Above Linux's pid_max (2**22), so a fake pid never names a real process if someone signals it.
_FAKE_PIDS = itertools.count(2**30)


@dataclass(frozen=True, slots=True)
class FakeOutcome:
    """How a fake task behaves. ``duration_s=None`` runs until terminated or killed."""

    returncode: int = 0
    duration_s: float | None = 0.0
    stdout: str = ""
    stderr: str = ""
    ignores_sigterm: bool = False


class FakeLauncher(AppLauncher):
    """A fake: starts no process; each task follows the ``FakeOutcome`` chosen for its spec."""

    name = "fake"

    def __init__(
        self,
        outcome: FakeOutcome | Callable[[TaskSpec], FakeOutcome] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._outcome = outcome if outcome is not None else FakeOutcome()
        self._clock = clock
        self._sleep = sleep
        self.started: list[FakeTask] = []

    def render_command(self, spec: TaskSpec) -> list[str]:
        """What a local backend would run; the fake runs nothing."""
        refuse_launch_params(spec, self.name)
        return ["bash", "-c", spec.script]

    def start(self, spec: TaskSpec) -> FakeTask:
        refuse_launch_params(spec, self.name)
        outcome = self._outcome(spec) if callable(self._outcome) else self._outcome
        if not spec.workdir.is_dir():
            raise StartFailed(f"job {spec.job_id}: could not start: no directory {spec.workdir}")
        try:
            if spec.stderr_path == spec.stdout_path:
                spec.stdout_path.write_text(outcome.stdout + outcome.stderr)
            else:
                spec.stdout_path.write_text(outcome.stdout)
                spec.stderr_path.write_text(outcome.stderr)
        except OSError as exc:
            raise StartFailed(f"job {spec.job_id}: could not start: {exc}") from exc
        task = FakeTask(spec, outcome, self._clock, self._sleep)
        self.started.append(task)
        return task


class FakeTask(RunningTask):
    """A fake task: its life is ``FakeOutcome`` played against the launcher's clock."""

    def __init__(
        self,
        spec: TaskSpec,
        outcome: FakeOutcome,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> None:
        super().__init__(spec)
        self.outcome = outcome
        self.env = render_env(spec)
        self.cwd: Path = spec.workdir
        self._clock = clock
        self._sleep = sleep
        self._pid = next(_FAKE_PIDS)
        self._started_at = clock()
        self._returncode: int | None = None
        self._kill_at: float | None = None

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def returncode(self) -> int | None:
        return self._returncode

    def poll(self) -> int | None:
        if self._returncode is None:
            now = self._clock()
            finishes_at = self._finishes_at()
            if self._kill_at is not None and now >= self._kill_at:
                self._returncode = -signal.SIGKILL
            elif finishes_at is not None and now >= finishes_at:
                self._returncode = self.outcome.returncode
        return self._returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else self._clock() + timeout
        while (status := self.poll()) is None:
            events = [t for t in (self._finishes_at(), self._kill_at, deadline) if t is not None]
            if not events:
                # A real task like this would block forever; a fake must not hang the test.
                raise WaitTimedOut(f"fake job {self.job_id} runs until stopped; wait() would hang")
            now = self._clock()
            if deadline is not None and now >= deadline:
                raise WaitTimedOut(f"fake job {self.job_id} still running after {timeout}s")
            self._sleep(max(min(events) - now, 0.0))
        return status

    def terminate(self, grace_s: float = DEFAULT_GRACE_S) -> None:
        if self.poll() is not None:
            return
        if not self.outcome.ignores_sigterm:
            self._returncode = -signal.SIGTERM
            return
        kill_at = self._clock() + max(grace_s, 0.0)
        self._kill_at = kill_at if self._kill_at is None else min(self._kill_at, kill_at)

    def kill(self) -> None:
        if self.poll() is None:
            self._returncode = -signal.SIGKILL

    @property
    def alive(self) -> bool:
        """Whether the pretend process group would still exist."""
        return self.poll() is None

    def _finishes_at(self) -> float | None:
        duration = self.outcome.duration_s
        return None if duration is None else self._started_at + duration
