"""The fake scheduler stepped by hand, and what the local one adds to the shared suite:
jobs survive the adapter, a job whose wrapper vanished is reported, files go beside the script."""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lodestream.platform_adapters.errors import SchedulerUnavailable, SubmitRejected
from lodestream.platform_adapters.schedulers import (
    BackfillWindow,
    BatchStatus,
    FakeOutcome,
    FakeScheduler,
    LocalScheduler,
)
from lodestream.schemas.resources import SchedulerState
from tests.support.scheduler_contract import CommandHarness, final_record, wait_for


class Clock:
    def __init__(self) -> None:
        self.now = 1_709_290_800.0  # 2024-03-01T11:00:00Z

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "pilot.sh"
    path.write_text("#!/bin/bash\n")
    return path


def test_fake_job_goes_queued_running_finished_on_its_clock(script: Path) -> None:
    clock = Clock()
    fake = FakeScheduler(FakeOutcome(queued_s=10, run_s=20, exit_code=0), clock=clock)
    job_id = fake.submit(script, nodes=2, wall_time_min=5, queue="debug")
    assert fake.status()[job_id].state is SchedulerState.QUEUED
    clock.now += 10
    running = fake.status()[job_id]
    assert running.state is SchedulerState.RUNNING
    assert running.hostnames == ("fake0001", "fake0002")
    assert running.start_time == datetime(2024, 3, 1, 11, 0, 10, tzinfo=UTC)
    clock.now += 25
    record = fake.accounting(job_id)
    assert (record.state, record.exit_code) == (SchedulerState.FINISHED, 0)
    assert record.end_time == datetime(2024, 3, 1, 11, 0, 30, tzinfo=UTC)
    assert fake.submitted[0].request.queue == "debug"


def test_fake_job_longer_than_its_wall_time_expires_at_it(script: Path) -> None:
    clock = Clock()
    fake = FakeScheduler(FakeOutcome(run_s=None), clock=clock)
    job_id = fake.submit(script, wall_time_min=2)
    clock.now += 119
    assert fake.status()[job_id].state is SchedulerState.RUNNING
    clock.now += 1
    assert fake.status()[job_id].state is SchedulerState.WALLTIME_EXPIRED


def test_fake_can_forget_ended_jobs_like_a_busy_queue(script: Path) -> None:
    fake = FakeScheduler(FakeOutcome(), clock=Clock(), list_finished=False)
    job_id = fake.submit(script, wall_time_min=2)
    assert fake.status() == {}
    assert fake.accounting(job_id).state is SchedulerState.FINISHED


def test_fake_is_steered_by_the_test(script: Path) -> None:
    clock = Clock()
    fake = FakeScheduler(FakeOutcome(queued_s=1000, run_s=None), clock=clock)
    job_id = fake.submit(script, wall_time_min=60)
    fake.start(job_id)
    assert fake.status()[job_id].state is SchedulerState.RUNNING
    clock.now += 1
    fake.finish(job_id, SchedulerState.FAILED, None)  # a node failure
    assert fake.accounting(job_id).state is SchedulerState.FAILED
    fake.reject_submissions("Invalid account or account/partition combination specified")
    with pytest.raises(SubmitRejected, match="Invalid account"):
        fake.submit(script, wall_time_min=60)
    fake.windows = [BackfillWindow(queue="debug", nodes=8, minutes=45)]
    assert fake.backfill_windows() == fake.windows
    fake.unavailable = True
    with pytest.raises(SchedulerUnavailable):
        fake.status()


def test_fake_cancel_of_a_queued_job_never_starts_it(script: Path) -> None:
    clock = Clock()
    fake = FakeScheduler(FakeOutcome(queued_s=10, run_s=5), clock=clock)
    job_id = fake.submit(script, wall_time_min=60)
    assert fake.delete(job_id) is True
    clock.now += 100
    record = fake.accounting(job_id)
    assert (record.state, record.start_time) == (SchedulerState.CANCELLED, None)
    assert fake.delete(job_id) is False


@pytest.fixture
def local(tmp_path: Path) -> CommandHarness:
    scheduler = LocalScheduler(tmp_path / "state", seconds_per_minute=1.0, grace_s=1.0)
    return CommandHarness(scheduler, tmp_path, wall_time_min=60, timeout_s=20.0)


def test_local_jobs_outlive_the_adapter(local: CommandHarness, tmp_path: Path) -> None:
    script = tmp_path / "hello.sh"
    script.write_text('echo "hello from $LODE_SCHEDULER_ID"\nsleep 0.3\n')
    job_id = local.scheduler.submit(script, wall_time_min=60, nodes=3, queue="laptop")
    again = LocalScheduler(tmp_path / "state")  # an agent restarted
    status = again.status()[job_id]
    assert (status.nodes, status.queue, status.wall_time_min) == (3, "laptop", 60)
    record = final_record(local, job_id)
    assert record.state is SchedulerState.FINISHED
    assert (tmp_path / f"hello.{job_id}.out").read_text() == f"hello from {job_id}\n"
    assert (tmp_path / f"hello.{job_id}.err").read_text() == ""
    assert again.accounting(job_id) == record


def test_local_ids_count_up(local: CommandHarness, tmp_path: Path) -> None:
    script = tmp_path / "quick.sh"
    script.write_text("true\n")
    ids = [local.scheduler.submit(script, wall_time_min=1) for _ in range(3)]
    assert [int(i) for i in ids] == [1, 2, 3]


def test_a_local_job_whose_wrapper_was_killed_is_reported_lost(
    local: CommandHarness, tmp_path: Path
) -> None:
    script = tmp_path / "long.sh"
    script.write_text(f'echo $$ > "{tmp_path}/script.pid"\nsleep 600\n')
    job_id = local.scheduler.submit(script, wall_time_min=60)

    def status() -> BatchStatus:
        return local.scheduler.status([job_id])[job_id]

    wait_for(local, "the job to run", lambda: status().state is SchedulerState.RUNNING or None)
    job_dir = tmp_path / "state" / "jobs" / job_id
    wrapper = int((job_dir / "wrapper.pid").read_text())
    os.kill(wrapper, signal.SIGKILL)  # as a reboot would, without recording how the job ended
    try:
        lost = wait_for(local, "the loss to show", lambda: status() if status().final else None)
        assert lost.state is SchedulerState.FAILED
        assert lost.native_state == "lost"
        assert "without recording" in lost.reason
    finally:
        # The orphaned script runs on in its own session (its pid is its group).
        pid = wait_for(local, "the script's pid", lambda: _read_int(tmp_path / "script.pid"))
        os.killpg(pid, signal.SIGKILL)


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def test_a_local_job_being_submitted_elsewhere_is_queued_not_lost(tmp_path: Path) -> None:
    scheduler = LocalScheduler(tmp_path / "state")
    job_dir = tmp_path / "state" / "jobs" / "7"
    job_dir.mkdir(parents=True)
    meta = {"nodes": 1, "queue": "", "wall_time_min": 5, "submitted": time.time()}
    (job_dir / "job.json").write_text(json.dumps(meta))  # its wrapper has not said its pid yet
    assert scheduler.status()["7"].state is SchedulerState.QUEUED


def test_a_refused_local_submission_leaves_no_job(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("true\n")
    scheduler = LocalScheduler(tmp_path / "state", python="/bin/false")
    with pytest.raises(SubmitRejected, match="wrapper exited 1"):
        scheduler.submit(script, wall_time_min=5)
    assert scheduler.status() == {}
