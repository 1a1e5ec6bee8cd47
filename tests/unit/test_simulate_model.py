"""The what-if simulator against answers worked out by hand."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest

from lodestream.client.analytics.simulate.calibrate import Calibration
from lodestream.client.analytics.simulate.engine import simulate
from lodestream.client.analytics.simulate.errors import BadScenario
from lodestream.client.analytics.simulate.model import (
    Attempt,
    JobTrace,
    PilotShape,
    Scenario,
    Storage,
    amdahl_s,
    io_s,
)
from lodestream.client.analytics.simulate.storage import SharedStorage
from lodestream.schemas.strategies import STRATEGIES


def job(arrival: float = 0.0, compute: float = 1.0, **costs: float) -> JobTrace:
    """A job of one attempt (``costs`` name its stages), or of several: ``retries`` failed
    attempts before, each like the last, requeued after ``requeue_s`` and ``backoff_s``."""
    nodes = int(costs.pop("num_nodes", 1))
    retries = int(costs.pop("retries", 0))
    prepare, finish = costs.pop("prepare_s", 0.0), costs.pop("finish_s", 0.0)
    requeue, backoff = costs.pop("requeue_s", 0.0), costs.pop("backoff_s", 0.0)
    first = Attempt(compute_s=compute, **{"dispatch_s": 0.0, "overhead_s": 0.0, **costs})
    again = replace(first, requeue_s=requeue, backoff_s=backoff)
    return JobTrace(site="a", app="x", num_nodes=nodes, arrival=arrival, prepare_s=prepare,
                    attempts=(first,) + (again,) * retries, finish_s=finish)  # fmt: skip


def child(*parents: int, **costs: float) -> JobTrace:
    """A job of one attempt that waits for ``parents``."""
    return replace(job(**costs), parents=parents)


def calibration(
    jobs: list[JobTrace],
    pilots: Mapping[str, tuple[PilotShape, ...]] | None = None,
    storage: Storage | None = None,
) -> Calibration:
    default: dict[str, tuple[PilotShape, ...]] = {"a": (PilotShape(0.0, (2,)),)}
    shapes = dict(pilots) if pilots is not None else default
    return Calibration(jobs=tuple(jobs), pilots=shapes, capacity_source="test", makespan_s=1.0,
                       storage=storage, stages={})  # fmt: skip


def test_four_equal_jobs_on_two_slots_take_two_rounds_and_one_on_four() -> None:
    cal = calibration([job() for _ in range(4)])
    assert simulate(cal, Scenario()).makespan_s == pytest.approx(2.0)
    assert simulate(cal, Scenario(slots=4)).makespan_s == pytest.approx(1.0)
    assert simulate(cal, Scenario(pilots=2)).makespan_s == pytest.approx(1.0)
    assert simulate(cal, Scenario(nodes=2)).makespan_s == pytest.approx(1.0)
    assert simulate(cal, Scenario(slots=4)).throughput_per_s == pytest.approx(4.0)


def test_staggered_arrivals() -> None:
    cal = calibration([job(0.5 * i) for i in range(4)], {"a": (PilotShape(0.0, (1,)),)})
    # One slot: they run back to back from 0: 0-1, 1-2, 2-3, 3-4.
    assert simulate(cal, Scenario()).makespan_s == pytest.approx(4.0)
    # Two: 0-1, 0.5-1.5, 1-2, 1.5-2.5; each waits for nothing.
    prediction = simulate(cal, Scenario(slots=2))
    assert prediction.makespan_s == pytest.approx(2.5)
    assert prediction.mean_wait_s == pytest.approx(0.0)


def test_stage_overheads_add_up_by_hand() -> None:
    costs = {"prepare_s": 0.1, "dispatch_s": 0.05, "overhead_s": 0.02, "finish_s": 0.03}
    cal = calibration([job(**costs), job(**costs)], {"a": (PilotShape(0.0, (1,)),)})
    # First: runnable 0.1, done 0.1 + 0.05 + 0.02 + 1 = 1.17; the second takes the slot
    # then and is done at 2.24, finished 0.03 later.
    prediction = simulate(cal, Scenario())
    assert prediction.makespan_s == pytest.approx(2.27)
    assert prediction.mean_wait_s == pytest.approx((0.0 + 1.07) / 2)


def test_a_pilot_that_opens_late_delays_the_work() -> None:
    cal = calibration([job()], {"a": (PilotShape(3.0, (1,)),)})
    assert simulate(cal, Scenario()).makespan_s == pytest.approx(4.0)


def test_shared_bandwidth_by_hand() -> None:
    assert io_s(100, 100, 2) == pytest.approx(2.0)
    storage = SharedStorage(100.0)
    storage.add(0.0, 1, 100.0)
    storage.add(0.0, 2, 300.0)
    # 50 B/s each until the first has its 100 bytes (t=2), then 100 B/s for the other's 200.
    assert storage.next_end() == pytest.approx(2.0)
    assert storage.pop_ended(2.0) == [1]
    assert storage.next_end() == pytest.approx(4.0)
    assert storage.pop_ended(4.0) == [2]


def test_io_then_compute_on_a_shared_tier_and_on_a_faster_one() -> None:
    jobs = [job(compute=1.0, io_bytes=100.0), job(compute=1.0, io_bytes=100.0)]
    cal = calibration(jobs, storage=Storage(100.0))
    # Both read at once, 50 B/s each: I/O ends at 2 s, compute at 3 s.
    assert simulate(cal, Scenario()).makespan_s == pytest.approx(3.0)
    # Staged to a tier four times as fast: 0.5 s of I/O.
    assert simulate(cal, Scenario(bandwidth=400.0)).makespan_s == pytest.approx(1.5)


def test_amdahl_by_hand() -> None:
    assert amdahl_s(10.0, 0.9, 4) == pytest.approx(10.0 * (0.1 + 0.9 / 4))
    assert amdahl_s(10.0, 0.0, 64) == pytest.approx(10.0)
    cal = calibration([job(compute=10.0)], {"a": (PilotShape(0.0, (1, 1, 1, 1)),)})
    scenario = Scenario(nodes_per_job=4, parallel_fraction=0.9)
    assert simulate(cal, scenario).makespan_s == pytest.approx(3.25)


def test_a_multi_node_job_waits_for_whole_nodes() -> None:
    jobs = [job(compute=1.0), job(compute=1.0, num_nodes=2)]
    cal = calibration(jobs, {"a": (PilotShape(0.0, (2, 2)),)})
    # The one-node job holds a slot of node 0 until 1 s; the two-node job needs both whole.
    assert simulate(cal, Scenario()).makespan_s == pytest.approx(2.0)


def test_routing_spreads_jobs_over_sites() -> None:
    pilots = {"a": (PilotShape(0.0, (1,)),), "b": (PilotShape(0.0, (1,)),)}
    cal = calibration([job(0.0 + 0.001 * i) for i in range(4)], pilots)
    assert simulate(cal, Scenario()).makespan_s == pytest.approx(4.0)  # all where recorded
    for strategy in STRATEGIES:
        prediction = simulate(cal, Scenario(strategy=strategy))
        assert prediction.per_site == {"a": 2, "b": 2}, strategy
        # a: jobs 0 and 2 back to back from 0; b: jobs 1 and 3 from 0.001.
        assert prediction.makespan_s == pytest.approx(2.001), strategy


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"slots": 0}, "slots must be between 1"),
        ({"pilots": -3}, "pilots must be between 1"),
        ({"bandwidth": 0.0}, "bandwidth must be a positive"),
        ({"bandwidth": float("nan")}, "bandwidth must be a positive"),
        ({"parallel_fraction": 1.5}, "parallel fraction"),
        ({"strategy": "fastest"}, "unknown strategy"),
    ],
)
def test_nonsense_scenarios_are_refused_with_a_reason(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(BadScenario, match=message):
        Scenario(**fields)  # type: ignore[arg-type]


def test_a_job_wider_than_every_pilot_is_refused() -> None:
    cal = calibration([job()])
    with pytest.raises(BadScenario, match="fits no pilot"):
        simulate(cal, Scenario(nodes_per_job=3))


def test_a_bandwidth_without_an_io_model_is_refused() -> None:
    with pytest.raises(BadScenario, match="I/O model"):
        simulate(calibration([job()]), Scenario(bandwidth=1e9))


def test_a_child_waits_for_its_parents_in_the_simulation_not_as_recorded() -> None:
    # A chain of three on four slots, then two independent jobs: the chain takes 3 s
    # whatever the capacity; the others run beside it.
    chain = [job(), child(0, prepare_s=0.1), child(1, prepare_s=0.1)]
    cal = calibration([*chain, job(), job()], {"a": (PilotShape(0.0, (1,)),)})
    # One slot: 0-1 the chain's head, then the others and the chain interleave in order of
    # becoming runnable: job 3 (1-2), job 4 (2-3), job 1 (runnable 1.1; 3-4), job 2 (4.1-5.1).
    assert simulate(cal, Scenario()).makespan_s == pytest.approx(5.1)
    # Four slots: the chain alone sets it, its links 0.1 s each.
    assert simulate(cal, Scenario(slots=4)).makespan_s == pytest.approx(3.2)


def test_a_failed_attempt_runs_again_after_its_backoff() -> None:
    flaky = job(retries=1, requeue_s=0.05, backoff_s=0.2, finish_s=0.01)
    cal = calibration([flaky, job()], {"a": (PilotShape(0.0, (1,)),)})
    # One slot: flaky 0-1, the other 1-2, flaky again from 2 (eligible at 1.25) to 3.
    assert simulate(cal, Scenario()).makespan_s == pytest.approx(3.01)
    # Two: flaky 0-1, again 1.25-2.25, finished 0.01 later.
    assert simulate(cal, Scenario(slots=2)).makespan_s == pytest.approx(2.26)


def test_a_job_that_never_ran_ends_after_its_parent() -> None:
    orphan = JobTrace(site="a", app="x", num_nodes=1, arrival=0.0, prepare_s=0.0,
                      attempts=(), finish_s=0.3, parents=(0,))  # fmt: skip
    assert simulate(calibration([job(), orphan]), Scenario()).makespan_s == pytest.approx(1.3)


def test_scaled_workloads_by_hand() -> None:
    cal = calibration([job(), child(0)], {"a": (PilotShape(0.0, (1,)),)})
    assert simulate(cal, Scenario()).makespan_s == pytest.approx(2.0)
    # Twice the jobs: two chains on one slot, 4 s; on two pilots, 2 s.
    assert simulate(cal, Scenario(jobs_factor=2)).makespan_s == pytest.approx(4.0)
    assert simulate(cal, Scenario(jobs_factor=2, pilots_factor=2)).makespan_s == pytest.approx(2.0)
    assert simulate(cal, Scenario(speed=2.0)).makespan_s == pytest.approx(1.0)
    spaced = calibration([job(), job(), job()], {"a": (PilotShape(0.0, (4,)),)})
    assert simulate(spaced, Scenario(arrival_rate=0.5)).makespan_s == pytest.approx(5.0)


def test_a_faster_tier_by_a_factor() -> None:
    jobs = [job(compute=1.0, io_bytes=100.0), job(compute=1.0, io_bytes=100.0)]
    cal = calibration(jobs, storage=Storage(100.0))
    assert simulate(cal, Scenario(bandwidth_factor=4.0)).makespan_s == pytest.approx(1.5)
