"""The shared scheduler suite (tests/support/scheduler_contract.py) on the fake and the local
backend. Local jobs are real detached processes; a minute of wall time lasts a second."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lodestream.platform_adapters.schedulers import LocalScheduler
from tests.support.scheduler_contract import (
    CommandHarness,
    FakeHarness,
    SchedulerContract,
    SchedulerHarness,
)


class TestFakeScheduler(SchedulerContract):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> SchedulerHarness:
        return FakeHarness(tmp_path)


class TestLocalScheduler(SchedulerContract):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> Iterator[SchedulerHarness]:
        scheduler = LocalScheduler(tmp_path / "state", seconds_per_minute=1.0, grace_s=1.0)
        yield CommandHarness(scheduler, tmp_path, wall_time_min=60, timeout_s=20.0)
        for job_id, status in scheduler.status().items():
            if not status.final:
                scheduler.delete(job_id)  # a failed test leaves no sleeper behind
