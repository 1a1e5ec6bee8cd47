"""``fastest_eta``'s estimate (services/api/capacity.py): slots, run times, work ahead, waves;
pure functions over read-model rows, no stack."""

from __future__ import annotations

from typing import Any

import pytest

from lodestream.schemas.resources import JobResources
from lodestream.schemas.states import FINAL, JobState
from lodestream.services.api.capacity import (
    DEFAULT_RUN_S,
    NO_PILOT_WAIT_S,
    SLOT_STATES,
    Estimate,
    Node,
    RunTimes,
    SiteCapacity,
    estimate,
    read_capacities,
    slots,
)

S = JobState


def shape(**fields: Any) -> JobResources:
    return JobResources.model_validate(fields)


def test_one_node_jobs_pack_by_count_cores_and_gpus() -> None:
    node = [Node(cores=8, gpus=2)]
    assert slots([node], shape()) == 1  # one job per node unless packed
    assert slots([node], shape(node_packing_count=4)) == 4
    assert slots([node], shape(node_packing_count=16)) == 8  # one core each
    assert slots([node], shape(node_packing_count=16, ranks_per_node=3)) == 2  # 3 cores each
    # Two hardware threads a core: 4 threads need 2 cores.
    assert slots([node], shape(node_packing_count=16, threads_per_rank=4, threads_per_core=2)) == 4
    assert slots([node], shape(node_packing_count=16, gpus_per_rank=1)) == 2
    assert slots([[Node(cores=8)]], shape(gpus_per_rank=1)) == 0  # no gpu: never fits
    assert slots([[Node(cores=2)]], shape(ranks_per_node=4)) == 0  # too few cores


def test_slots_add_up_over_nodes_and_pilots() -> None:
    pilots = [[Node(cores=4), Node(cores=4)], [Node(cores=2)]]
    assert slots(pilots, shape(node_packing_count=4)) == 4 + 4 + 2
    assert slots(pilots, shape(node_packing_count=4, ranks_per_node=4)) == 2  # the 2-core node
    assert slots([], shape()) == 0


def test_a_multi_node_job_needs_whole_nodes_of_one_pilot() -> None:
    pilots = [[Node(cores=4)] * 5, [Node(cores=4)]]
    assert slots(pilots, shape(num_nodes=2)) == 2  # 5 // 2 and 1 // 2
    assert slots(pilots, shape(num_nodes=2, node_packing_count=8)) == 2  # packing is moot
    small = [[Node(cores=4), Node(cores=4), Node(cores=1)]]
    assert slots(small, shape(num_nodes=2, ranks_per_node=2)) == 1  # the 1-core node is out


def test_the_next_job_ends_a_whole_wave_of_its_run_time_later() -> None:
    def eta(ahead_s: float, slots: int = 2, run_s: float = 0.3, wait_s: float = 0.0) -> float:
        return Estimate(slots=slots, run_s=run_s, wait_s=wait_s, ahead_s=ahead_s).eta_s

    assert eta(0.0) == pytest.approx(0.3)
    assert eta(0.3) == pytest.approx(0.3)  # the second slot is free
    assert eta(sum([0.3] * 4)) == pytest.approx(0.9)  # two whole waves ahead
    # Six run times of 0.1 s summed are a hair under 0.6: still three whole waves.
    assert sum([0.1] * 6) / (2 * 0.1) < 3
    assert eta(sum([0.1] * 6), run_s=0.1) == pytest.approx(0.4)
    assert eta(0.3 * 3) == pytest.approx(0.6)
    assert eta(5.0, slots=4, run_s=1.0) == pytest.approx(2.0)  # 1.25 waves ahead: the 2nd
    assert eta(0.0, slots=1, run_s=1.0, wait_s=NO_PILOT_WAIT_S) == NO_PILOT_WAIT_S + 1.0
    assert Estimate(slots=4, run_s=0.5, wait_s=0.0, ahead_s=0.0).throughput_per_s == 8.0


def test_a_run_time_falls_back_from_the_app_here_to_any_app_here_to_the_app_elsewhere() -> None:
    runs = RunTimes({"sim": 7.0, "fit": 0.0})
    here = SiteCapacity(run_s={"sim": 2.0}, any_run_s=3.0)
    assert runs.of(here, "sim") == 2.0
    assert runs.of(here, "other") == 3.0
    assert runs.of(SiteCapacity(), "sim") == 7.0
    assert runs.of(SiteCapacity(), "other") == DEFAULT_RUN_S
    assert runs.of(SiteCapacity(), "fit") == DEFAULT_RUN_S  # a zero run time is no estimate
    queued = SiteCapacity(run_s={"sim": 2.0}, any_run_s=3.0, queued={"sim": 4, "other": 1})
    assert runs.queued_s(queued) == 4 * 2.0 + 3.0


def test_a_site_without_a_pilot_that_fits_waits_for_one_of_one_slot() -> None:
    runs = RunTimes()
    none = estimate(SiteCapacity(run_s={"sim": 5.0}), "sim", shape(), 10.0, runs)
    assert (none.slots, none.wait_s, none.run_s) == (1, NO_PILOT_WAIT_S, 5.0)
    assert none.eta_s == NO_PILOT_WAIT_S + 15.0
    cpu_only = SiteCapacity(pilots=((Node(cores=64),),), run_s={"sim": 5.0})
    gpu_job = estimate(cpu_only, "sim", shape(gpus_per_rank=1), 0.0, runs)
    assert (gpu_job.slots, gpu_job.wait_s) == (1, NO_PILOT_WAIT_S)
    open_pilot = estimate(cpu_only, "sim", shape(node_packing_count=8), 10.0, runs)
    assert (open_pilot.slots, open_pilot.wait_s, open_pilot.eta_s) == (8, 0.0, 5.0)


def test_capacities_are_read_from_the_rows_of_the_wanted_sites() -> None:
    pilots = [
        ("a", [{"hostname": "n1", "cores": 4, "gpus": 1}, {"hostname": "n2", "cores": 4}]),
        ("a", [{"hostname": "n3", "cores": 2, "gpus": 0}]),
        ("elsewhere", [{"hostname": "x", "cores": 128}]),
    ]
    runs = [
        ("a", "sim", 1.0), ("a", "sim", 3.0), ("a", "sim", 2.0), ("a", "fit", 10.0),
        ("b", "sim", 5.0), ("b", "sim", 0.0), ("elsewhere", "sim", 99.0),
    ]  # fmt: skip
    queued = [("a", "sim", 2), ("a", "sim", 3), ("b", "fit", 1), ("elsewhere", "sim", 9)]
    capacities, run_times = read_capacities(["a", "b", "c"], pilots, runs, queued)
    assert sorted(capacities) == ["a", "b", "c"]
    a, b, c = capacities["a"], capacities["b"], capacities["c"]
    assert a.pilots == ((Node(4, 1), Node(4, 0)), (Node(2, 0),))
    assert a.run_s == {"sim": 2.0, "fit": 10.0}
    assert a.any_run_s == 2.5  # median of 1, 2, 3, 10
    assert a.queued == {"sim": 5}
    assert (b.pilots, b.run_s, b.any_run_s, b.queued) == ((), {"sim": 5.0}, 5.0, {"fit": 1})
    assert c == SiteCapacity()
    # Across the wanted sites only, and no zero run time.
    assert run_times.elsewhere == {"sim": 2.5, "fit": 10.0}


def test_only_jobs_whose_run_is_not_over_wait_for_a_slot() -> None:
    over = {S.RUN_DONE, S.POSTPROCESSED, S.STAGED_OUT}
    assert frozenset(JobState) - FINAL - over == SLOT_STATES
    assert {S.CREATED, S.AWAITING_PARENTS, S.PREPROCESSED, S.RUNNING, S.RESTART_READY} <= (
        SLOT_STATES
    )
