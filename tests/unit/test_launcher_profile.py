"""The run's profile: per-component timestamps the pilot records in its result event."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from lodestream.agents.launcher import decide
from lodestream.agents.launcher.decide import RunEnd
from lodestream.agents.launcher.jobs import profile_of
from lodestream.agents.launcher.tasks import Tracked
from lodestream.agents.launcher.work import WorkItem
from lodestream.platform_adapters.launchers.base import TaskSpec
from lodestream.platform_adapters.launchers.fake import FakeLauncher, FakeOutcome
from lodestream.platform_adapters.packing import Allocation
from lodestream.schemas.events import JobFinished, JobRunErrored, JobRunTimedOut
from lodestream.schemas.events.job import FinishedData, RunProfile, RunResultData
from lodestream.schemas.resources import INT32_MAX, App, JobSpec

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
SPEC = JobSpec(site="alpha", app="demo", workdir="demo/1")
ITEM = WorkItem(site="alpha", job_id=uuid.uuid4(), seq=5, spec=SPEC, attempt=1, msg=None)


def at(ms: int) -> datetime:
    return T0 + timedelta(milliseconds=ms)


def test_a_profile_in_order_is_accepted_with_its_pid() -> None:
    profile = RunProfile(leased_at=at(0), spawning_at=at(1), started_at=at(3), exited_at=at(250),
                         pid=4242)  # fmt: skip
    assert profile.pid == 4242
    assert RunResultData(profile=profile).profile == profile


def test_equal_times_are_in_order() -> None:
    # A coarse clock gives two steps the same time; that is not going backwards.
    assert RunProfile(leased_at=at(0), spawning_at=at(0), started_at=at(0), exited_at=at(0))


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"spawning_at": at(-1)}, "spawning_at"),
        ({"spawning_at": at(5), "started_at": at(4)}, "started_at"),
        ({"started_at": at(5), "exited_at": at(1)}, "exited_at"),
        # A gap (no spawn time) still compares what is there.
        ({"exited_at": at(-10)}, "exited_at"),
    ],
)
def test_times_that_go_backwards_are_refused(fields: dict[str, datetime], named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        RunProfile(leased_at=at(0), **fields)


@pytest.mark.parametrize("pid", [-1, INT32_MAX + 1])
def test_a_pid_out_of_range_is_refused(pid: int) -> None:
    with pytest.raises(ValidationError, match="pid"):
        RunProfile(leased_at=at(0), started_at=at(1), pid=pid)


def test_a_pid_without_a_started_process_is_refused() -> None:
    with pytest.raises(ValidationError, match="no process was started"):
        RunProfile(leased_at=at(0), pid=12)


def test_naive_times_are_refused() -> None:
    with pytest.raises(ValidationError, match="timezone"):
        RunProfile(leased_at=datetime(2025, 3, 1, 12, 0))  # noqa: DTZ001 - the point


def test_an_old_result_without_a_profile_still_decodes() -> None:
    assert RunResultData.model_validate({"return_code": 0}).profile is None


async def _tracked(tmp_path: Path, *, spawning: float, started: float, exited: float) -> Tracked:
    spec = TaskSpec(job_id=str(ITEM.job_id), script="true", workdir=tmp_path, env={},
                    allocation=Allocation("j", ()), stdout_path=tmp_path / "out",
                    stderr_path=tmp_path / "err")  # fmt: skip
    task = FakeLauncher(FakeOutcome()).start(spec)
    tracked = Tracked(task, 0.0, spawning_at=spawning, started_at=started)
    tracked.exited_at = exited
    return tracked


async def test_profile_of_turns_the_pilots_captures_into_utc_times(tmp_path: Path) -> None:
    leased = T0.timestamp()
    tracked = await _tracked(tmp_path, spawning=leased + 0.001, started=leased + 0.004,
                             exited=leased + 0.5)  # fmt: skip
    profile = profile_of(leased, tracked)
    assert profile is not None
    assert profile.leased_at == T0
    assert profile.spawning_at == at(1)
    assert profile.started_at == at(4)
    assert profile.exited_at == at(500)
    assert profile.pid == tracked.task.pid


async def test_a_clock_that_stepped_back_drops_the_profile_not_the_result(tmp_path: Path) -> None:
    leased = T0.timestamp()
    tracked = await _tracked(tmp_path, spawning=leased + 0.001, started=leased + 0.002,
                             exited=leased - 30)  # an NTP step during the run  # fmt: skip
    assert profile_of(leased, tracked) is None


PROFILE = RunProfile(leased_at=at(0), spawning_at=at(1), started_at=at(2), exited_at=at(300),
                     pid=31337)  # fmt: skip


def _end(code: int = 0, **changes: object) -> RunEnd:
    end = RunEnd(return_code=code, runtime_s=0.3, stderr_tail="", pyrun_result=None,
                 profile=PROFILE)  # fmt: skip
    return replace(end, **changes)  # type: ignore[arg-type]


def test_a_run_that_finishes_the_job_carries_the_profile_in_its_run() -> None:
    outcome = decide.run_result(ITEM, _end(), App(site="alpha", name="demo"))
    assert outcome.kind is JobFinished
    assert isinstance(outcome.data, FinishedData)
    assert outcome.data.run is not None
    assert outcome.data.run.profile == PROFILE


def test_a_failed_run_carries_the_profile() -> None:
    outcome = decide.run_result(ITEM, _end(3, stderr_tail="boom"), None)
    assert outcome.kind is JobRunErrored
    assert isinstance(outcome.data, RunResultData)
    assert outcome.data.profile == PROFILE


def test_a_lost_run_and_an_unusable_result_carry_the_profile() -> None:
    lost = decide.run_result(ITEM, _end(-9, lost="rank 3 lost"), None)
    assert lost.kind is JobRunTimedOut
    assert isinstance(lost.data, RunResultData)
    assert lost.data.profile == PROFILE
    unusable = decide.run_result(ITEM, _end(pyrun_result="not json"), None)
    assert unusable.kind is JobRunErrored
    assert isinstance(unusable.data, RunResultData)
    assert unusable.data.profile == PROFILE
