"""How many processes a split takes when nobody says: the cores this process may use."""

from __future__ import annotations

import os

import pytest

from lodestream.shares import SPLIT_FROM, default_workers, usable_cores, usable_workers


@pytest.mark.parametrize(
    ("cores", "events", "workers"),
    [
        (1, 10 * SPLIT_FROM, 1),  # a batch job or a container given one core of many
        (2, 10 * SPLIT_FROM, 2),
        (8, 10 * SPLIT_FROM, 4),
        (8, SPLIT_FROM - 1, 1),  # a short range is folded where it is read
    ],
)
def test_a_split_takes_the_cores_it_may_use(
    monkeypatch: pytest.MonkeyPatch, cores: int, events: int, workers: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(cores)))
    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # the host's: not what counts
    assert usable_cores() == cores
    assert default_workers(events) == workers
    assert usable_workers(64) == cores
