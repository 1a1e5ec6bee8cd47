"""One test suite for every batch scheduler adapter: what ``Scheduler`` promises (base.py).

A backend plugs in with a harness that knows how to make a batch script behave a certain way
on it, and a test class that inherits the suite::

    class TestSlurmContract(SchedulerContract):
        @pytest.fixture
        def harness(self, slurm_cluster, tmp_path):   # however that backend is set up
            return CommandHarness(SlurmScheduler(), tmp_path, wall_time_min=5,
                                  submit_kwargs={"queue": "debug"}, timeout_s=180,
                                  checks_wall_time=False)

``CommandHarness`` suits any backend that really runs the scripts (local, Slurm, PBS, ...):
scripts are bash files under ``workdir``, which the scheduler's nodes must see. The fake has
its own harness, since it runs nothing. Tests poll; ``timeout_s`` bounds each wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest

from lodestream.platform_adapters.errors import (
    InvalidSubmission,
    NotSupported,
    SubmitRejected,
    UnknownBatchJob,
)
from lodestream.platform_adapters.schedulers import (
    BackfillWindow,
    BatchRecord,
    BatchRequest,
    FakeOutcome,
    FakeScheduler,
    Scheduler,
)
from lodestream.schemas.resources import SchedulerState

_POLL_S = 0.05


@dataclass(frozen=True)
class Behaviour:
    """What a test's batch script does."""

    exit_code: int = 0
    runs_s: float = 0.0
    runs_until_stopped: bool = False
    writes_env: str | None = None  # the name of a variable the script records (if it runs)


class SchedulerHarness(Protocol):
    @property
    def scheduler(self) -> Scheduler: ...

    wall_time_min: int  # what submissions ask for: longer than any test waits
    submit_kwargs: Mapping[str, Any]  # project / queue this backend needs
    timeout_s: float
    runs_scripts: bool
    checks_wall_time: bool  # False where the shortest wall time is too long to wait for

    def script(self, behaviour: Behaviour) -> Path: ...
    def seen_env(self, script: Path) -> str: ...


@dataclass
class CommandHarness:
    """Scripts as bash files; for every backend that runs them."""

    scheduler: Scheduler
    workdir: Path
    wall_time_min: int = 60
    submit_kwargs: Mapping[str, Any] = field(default_factory=dict)
    timeout_s: float = 30.0
    runs_scripts: bool = True
    checks_wall_time: bool = True
    _count: int = 0

    def script(self, behaviour: Behaviour) -> Path:
        self._count += 1
        path = self.workdir / f"pilot-{self._count}.sh"
        lines = ["#!/bin/bash"]
        if behaviour.writes_env:
            lines.append(f'printf %s "${behaviour.writes_env}" > "{path}.env"')
        if behaviour.runs_until_stopped:
            lines.append("sleep 600")
        elif behaviour.runs_s:
            lines.append(f"sleep {behaviour.runs_s}")
        lines.append(f"exit {behaviour.exit_code}")
        path.write_text("\n".join(lines) + "\n")
        return path

    def seen_env(self, script: Path) -> str:
        return Path(f"{script}.env").read_text()


@dataclass
class FakeHarness:
    """The fake runs nothing: a script's behaviour becomes its ``FakeOutcome``."""

    workdir: Path
    wall_time_min: int = 60
    submit_kwargs: Mapping[str, Any] = field(default_factory=dict)
    timeout_s: float = 5.0
    runs_scripts: bool = False
    checks_wall_time: bool = True
    outcomes: dict[Path, FakeOutcome] = field(default_factory=dict)
    scheduler: FakeScheduler = field(init=False)

    def __post_init__(self) -> None:
        # A minute of wall time lasts 0.2 s: the wall-time test takes a fifth of a second.
        self.scheduler = FakeScheduler(self._outcome, seconds_per_minute=0.2)
        self.scheduler.windows = [BackfillWindow(queue="debug", nodes=4, minutes=30)]

    def _outcome(self, script: Path, request: BatchRequest) -> FakeOutcome:
        return self.outcomes[script]

    def script(self, behaviour: Behaviour) -> Path:
        path = self.workdir / f"pilot-{len(self.outcomes) + 1}.sh"
        path.write_text("#!/bin/bash\n")
        run_s = None if behaviour.runs_until_stopped else behaviour.runs_s
        self.outcomes[path] = FakeOutcome(run_s=run_s, exit_code=behaviour.exit_code)
        return path

    def seen_env(self, script: Path) -> str:
        raise AssertionError("the fake runs no script")


def wait_for(harness: SchedulerHarness, what: str, probe: Callable[[], Any]) -> Any:
    """Poll ``probe`` until it returns something other than None; fail after the timeout."""
    deadline = time.monotonic() + harness.timeout_s
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {harness.timeout_s} s waiting for {what}")
        time.sleep(_POLL_S)


def final_record(harness: SchedulerHarness, job_id: str) -> BatchRecord:
    """How the job ended: from ``status`` while it is listed, then from ``accounting``."""

    def probe() -> BatchRecord | None:
        status = harness.scheduler.status([job_id]).get(job_id)
        if status is not None and not status.final:
            return None
        if harness.scheduler.capabilities.accounting:
            record = harness.scheduler.accounting(job_id)
            return record if record.final else None
        assert status is not None, "a scheduler without accounting must list ended jobs"
        return BatchRecord.from_status(status)

    return wait_for(harness, f"job {job_id} to end", probe)  # type: ignore[no-any-return]


class SchedulerContract:
    """The shared suite; a subclass provides the ``harness`` fixture (see the module doc)."""

    @pytest.fixture
    def harness(self) -> Iterator[SchedulerHarness]:
        raise NotImplementedError("a backend's test class provides the harness fixture")

    def submit(self, harness: SchedulerHarness, behaviour: Behaviour, **overrides: Any) -> str:
        kwargs = {"wall_time_min": harness.wall_time_min, **harness.submit_kwargs, **overrides}
        return harness.scheduler.submit(harness.script(behaviour), **kwargs)

    def test_submit_returns_an_id_that_status_lists(self, harness: SchedulerHarness) -> None:
        job_id = self.submit(harness, Behaviour(runs_until_stopped=True), nodes=2)
        assert isinstance(job_id, str)
        assert job_id
        status = harness.scheduler.status([job_id])[job_id]
        assert status.scheduler_id == job_id
        assert status.state in {SchedulerState.QUEUED, SchedulerState.RUNNING}
        assert status.nodes in {0, 2}  # 0: a scheduler that does not say before it starts
        harness.scheduler.delete(job_id)

    def test_a_job_that_exits_0_finishes(self, harness: SchedulerHarness) -> None:
        job_id = self.submit(harness, Behaviour(exit_code=0))
        record = final_record(harness, job_id)
        assert record.state is SchedulerState.FINISHED
        assert record.exit_code in {0, None}

    def test_a_failing_job_fails_with_its_exit_code(self, harness: SchedulerHarness) -> None:
        job_id = self.submit(harness, Behaviour(exit_code=3))
        record = final_record(harness, job_id)
        assert record.state is SchedulerState.FAILED
        assert record.exit_code == 3

    def test_accounting_has_start_before_end(self, harness: SchedulerHarness) -> None:
        if not harness.scheduler.capabilities.accounting:
            pytest.skip("this scheduler keeps no accounting")
        job_id = self.submit(harness, Behaviour(runs_s=0.2))
        record = final_record(harness, job_id)
        assert record.start_time is not None
        assert record.end_time is not None
        assert record.start_time <= record.end_time

    def test_a_running_job_can_be_deleted(self, harness: SchedulerHarness) -> None:
        job_id = self.submit(harness, Behaviour(runs_until_stopped=True))
        wait_for(
            harness,
            "the job to run",
            lambda: (
                harness.scheduler.status([job_id])[job_id].state is SchedulerState.RUNNING or None
            ),
        )
        assert harness.scheduler.delete(job_id) is True
        assert final_record(harness, job_id).state is SchedulerState.CANCELLED

    def test_deleting_an_ended_job_says_so(self, harness: SchedulerHarness) -> None:
        job_id = self.submit(harness, Behaviour(exit_code=0))
        final_record(harness, job_id)
        assert harness.scheduler.delete(job_id) is False

    def test_a_job_past_its_wall_time_expires(self, harness: SchedulerHarness) -> None:
        if not harness.checks_wall_time:
            pytest.skip("this backend's shortest wall time is too long to wait for")
        job_id = self.submit(harness, Behaviour(runs_until_stopped=True), wall_time_min=1)
        assert final_record(harness, job_id).state is SchedulerState.WALLTIME_EXPIRED

    def test_status_without_ids_lists_this_users_jobs(self, harness: SchedulerHarness) -> None:
        job_id = self.submit(harness, Behaviour(runs_until_stopped=True))
        assert job_id in harness.scheduler.status()
        harness.scheduler.delete(job_id)

    def test_a_listing_shows_the_name_the_job_was_submitted_with(
        self, harness: SchedulerHarness
    ) -> None:
        # The site agent finds a submission whose id it lost by this name (decide.find_submitted).
        name = "lode-contract-0b6c"
        job_id = self.submit(harness, Behaviour(runs_until_stopped=True), job_name=name)
        assert harness.scheduler.status([job_id])[job_id].name == name
        assert harness.scheduler.status()[job_id].name == name
        harness.scheduler.delete(job_id)

    def test_unknown_ids_are_absent_not_errors(self, harness: SchedulerHarness) -> None:
        assert harness.scheduler.status(["987654321"]) == {}
        assert harness.scheduler.status([]) == {}
        assert harness.scheduler.delete("987654321") is False

    def test_accounting_of_an_unknown_job_raises(self, harness: SchedulerHarness) -> None:
        if not harness.scheduler.capabilities.accounting:
            with pytest.raises(NotSupported):
                harness.scheduler.accounting("987654321")
            return
        with pytest.raises(UnknownBatchJob):
            harness.scheduler.accounting("987654321")

    def test_a_missing_script_is_rejected(self, harness: SchedulerHarness, tmp_path: Path) -> None:
        with pytest.raises(SubmitRejected):
            harness.scheduler.submit(
                tmp_path / "no such script.sh",
                wall_time_min=harness.wall_time_min,
                **harness.submit_kwargs,
            )

    def test_a_malformed_request_is_refused_before_anything_runs(
        self, harness: SchedulerHarness
    ) -> None:
        script = harness.script(Behaviour())
        for bad in ({"nodes": 0}, {"wall_time_min": 0}, {"options": {"x --y": "1"}}):
            kwargs = {"wall_time_min": harness.wall_time_min, **harness.submit_kwargs, **bad}
            with pytest.raises(InvalidSubmission):
                harness.scheduler.submit(script, **kwargs)

    def test_backfill_windows_are_answered_or_not_supported(
        self, harness: SchedulerHarness
    ) -> None:
        if not harness.scheduler.capabilities.backfill:
            with pytest.raises(NotSupported):
                harness.scheduler.backfill_windows()
            return
        for window in harness.scheduler.backfill_windows():
            assert window.nodes >= 1
            assert window.minutes is None or window.minutes >= 1

    def test_the_job_gets_the_requested_environment(self, harness: SchedulerHarness) -> None:
        if not harness.runs_scripts:
            pytest.skip("this backend runs no scripts")
        script = harness.script(Behaviour(writes_env="LODE_CONTRACT_VALUE"))
        job_id = harness.scheduler.submit(
            script,
            wall_time_min=harness.wall_time_min,
            env={"LODE_CONTRACT_VALUE": "a value, with: odd = characters"},
            **harness.submit_kwargs,
        )
        assert final_record(harness, job_id).state is SchedulerState.FINISHED
        assert harness.seen_env(script) == "a value, with: odd = characters"

    def test_a_rendered_script_starts_with_bash_and_its_directives(
        self, harness: SchedulerHarness
    ) -> None:
        request = BatchRequest(nodes=2, wall_time_min=30, **harness.submit_kwargs)
        text = harness.scheduler.render_script("echo hello\n", request)
        header = harness.scheduler.render_script_header(request)
        assert text == "#!/bin/bash\n" + header + "echo hello\n"
        assert all(line.startswith("#") for line in header.splitlines())


__all__ = [
    "Behaviour",
    "CommandHarness",
    "FakeHarness",
    "SchedulerContract",
    "SchedulerHarness",
    "final_record",
    "wait_for",
]
