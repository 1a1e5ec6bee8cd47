"""The pilot drains ahead of its wall time, so it reports before the scheduler kills it, and
says so for its batch job, which the scheduler records as completed."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from lodestream.agents.launcher.main import DRAIN_MARGIN_S, drain_margin_s, leave_verdict
from lodestream.agents.launcher.report import ExitReason
from lodestream.agents.site.scheduler.pilot_end import pilot_end_path, read_pilot_end
from lodestream.agents.site.settings import SiteSettings
from lodestream.schemas.resources import SchedulerState


@pytest.mark.parametrize(
    ("wall_s", "margin_s"),
    [
        (60.0, 6.0),  # a one-minute pilot (the Slurm tests) drains 6 s early
        (300.0, DRAIN_MARGIN_S),  # from five minutes on, the scheduler's usual KillWait
        (7200.0, DRAIN_MARGIN_S),
        (0.0, 0.0),
    ],
)
def test_the_margin_is_a_tenth_of_the_wall_time_up_to_a_kill_wait(
    wall_s: float, margin_s: float
) -> None:
    assert drain_margin_s(wall_s) == pytest.approx(margin_s)


def test_a_pilot_always_keeps_most_of_its_wall_time() -> None:
    for wall_s in (1.0, 30.0, 60.0, 299.0, 301.0, 86_400.0):
        assert 0 < drain_margin_s(wall_s) <= wall_s * 0.1 + 1e-9


@pytest.mark.parametrize(
    ("reason", "remaining_s", "left"),
    [
        ("wall time reached", 20.0, True),  # drained ahead of the scheduler's kill
        ("stopped", 10.0, True),  # the scheduler's SIGTERM at the wall time
        ("stopped", 3600.0, False),  # cancelled or preempted: the scheduler says so itself
        ("idle", 3600.0, False),
    ],
)
def test_a_pilot_that_ends_at_its_wall_time_says_so_for_its_batch_job(
    tmp_path: Path, reason: str, remaining_s: float, left: bool
) -> None:
    settings = SiteSettings.model_validate(
        {"site": "alpha", "nats": {"url": "wss://127.0.0.1:1"}, "directory": tmp_path}
    )
    batch = uuid.uuid4()
    leave_verdict(settings, batch, ExitReason(reason), remaining_s)
    path = pilot_end_path(tmp_path / "batch", batch)
    assert read_pilot_end(path) is (SchedulerState.WALLTIME_EXPIRED if left else None)
