"""The pilot drains ahead of its wall time, so it reports before the scheduler kills it."""

from __future__ import annotations

import pytest

from lodestream.agents.launcher.main import DRAIN_MARGIN_S, drain_margin_s


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
