"""The free-port fixture under pytest-xdist: each worker hands out ports from its own slice."""

from __future__ import annotations

import pytest

from tests.fixtures import ports


@pytest.mark.parametrize("count", [2, 3, 8])
def test_the_workers_slices_are_disjoint_and_inside_the_range(
    monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    slices = []
    for index in range(count):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{index}")
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(count))
        slices.append(ports._worker_slice(20000, 32767))

    taken = [set(range(low, high + 1)) for low, high in slices]
    assert all(low >= 20000 and high <= 32767 and high - low > 1000 for low, high in slices)
    assert sum(len(s) for s in taken) == len(set().union(*taken))


def test_outside_xdist_the_whole_range_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)

    assert ports._worker_slice(20000, 32767) == (20000, 32767)


def test_a_worker_hands_out_ports_of_its_slice_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    low, high = ports._worker_slice(ports._LOWEST, ports._ephemeral_start() - 1)

    handed = [ports.free_port() for _ in range(20)]

    assert all(low <= port <= high for port in handed)
    assert len(set(handed)) == len(handed)
