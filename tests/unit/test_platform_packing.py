"""Node packing: Balsam's rules, bookkeeping invariants, and a seeded randomized walk."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from lodestream.platform_adapters.compute import ComputeNode, NodePlacement, NodeSpec
from lodestream.platform_adapters.errors import (
    InsufficientResources,
    InvalidNodeSpec,
    InvalidRequest,
    UnknownJob,
)
from lodestream.platform_adapters.packing import Allocation, JobRequest, NodePacker
from lodestream.schemas.resources import JobResources


def nodes(count: int, cpus: int = 8, gpus: int = 0, prefix: str = "n") -> list[NodeSpec]:
    return [
        NodeSpec(f"{prefix}{i}", tuple(range(cpus)), tuple(str(g) for g in range(gpus)))
        for i in range(count)
    ]


def single(job_id: str, **kw: int) -> JobRequest:
    return JobRequest(job_id=job_id, **kw)


# --- requests ---------------------------------------------------------------------------


def test_request_derives_cpus_from_ranks_threads_and_threads_per_core() -> None:
    request = JobRequest("j", ranks_per_node=3, threads_per_rank=3, threads_per_core=2)
    assert request.cpus_per_node == 5  # ceil(9 / 2)
    assert JobRequest("j", ranks_per_node=4, gpus_per_rank=2).gpus_per_node == 8
    assert JobRequest("j", node_packing_count=4).occupancy == 0.25
    assert JobRequest("j", num_nodes=2, node_packing_count=4).occupancy == 1.0


@pytest.mark.parametrize(
    "bad",
    [
        {"num_nodes": 0},
        {"ranks_per_node": 0},
        {"threads_per_rank": 0},
        {"threads_per_core": 0},
        {"node_packing_count": 0},
        {"gpus_per_rank": -1},
        {"wall_time_min": -1},
    ],
)
def test_request_rejects_out_of_range_values(bad: dict[str, int]) -> None:
    with pytest.raises(InvalidRequest):
        JobRequest("j", **bad)


def test_request_from_job_resources() -> None:
    resources = JobResources(
        num_nodes=2, ranks_per_node=4, threads_per_rank=2, gpus_per_rank=1, wall_time_min=30
    )
    request = JobRequest.from_resources("j1", resources)
    assert (request.num_nodes, request.cpus_per_node, request.gpus_per_node) == (2, 8, 4)
    assert request.wall_time_min == 30


# --- single-node packing ----------------------------------------------------------------


def test_node_packing_count_lets_k_jobs_share_a_node_and_no_more() -> None:
    packer = NodePacker(nodes(1, cpus=64))
    allocations = [packer.allocate(single(f"j{i}", node_packing_count=3)) for i in range(3)]
    assert all(a is not None for a in allocations)
    assert packer.allocate(single("j3", node_packing_count=3)) is None
    assert packer.nodes[0].occupancy == pytest.approx(1.0)


def test_ten_tenths_fill_a_node_despite_float_rounding() -> None:
    packer = NodePacker(nodes(1, cpus=64))
    for i in range(10):
        assert packer.allocate(single(f"j{i}", node_packing_count=10)) is not None
    assert packer.allocate(single("j10", node_packing_count=10)) is None


def test_cpu_accounting_uses_threads_and_threads_per_core() -> None:
    packer = NodePacker(nodes(1, cpus=8))
    a = packer.allocate(single("a", ranks_per_node=2, threads_per_rank=4, node_packing_count=4))
    assert a is not None
    assert a.placements[0].cpu_ids == tuple(range(8))
    assert packer.allocate(single("b", node_packing_count=4)) is None  # no cpu left

    packer.release("a")
    b = packer.allocate(
        single("b", ranks_per_node=2, threads_per_rank=4, threads_per_core=2, node_packing_count=2)
    )
    assert b is not None
    assert len(b.placements[0].cpu_ids) == 4
    c = packer.allocate(single("c", ranks_per_node=4, node_packing_count=2))
    assert c is not None
    assert set(b.placements[0].cpu_ids).isdisjoint(c.placements[0].cpu_ids)


def test_gpu_accounting() -> None:
    packer = NodePacker(nodes(1, cpus=16, gpus=4))
    a = packer.allocate(single("a", ranks_per_node=2, gpus_per_rank=1, node_packing_count=8))
    b = packer.allocate(single("b", gpus_per_rank=2, node_packing_count=8))
    assert a is not None
    assert b is not None
    assert a.placements[0].gpu_ids == ("0", "1")
    assert b.placements[0].gpu_ids == ("2", "3")
    assert packer.allocate(single("c", gpus_per_rank=1, node_packing_count=8)) is None
    assert packer.allocate(single("d", node_packing_count=8)) is not None  # cpu-only still fits


def test_gpu_ids_come_back_in_discovery_order() -> None:
    node = ComputeNode(NodeSpec("h", (0, 1), ("2", "10", "3")))
    node.assign("a", 0, 3, 0.5)
    node.release("a")
    assert node.idle_gpu_ids == ("2", "10", "3")


def test_small_jobs_fill_partially_used_nodes_first() -> None:
    packer = NodePacker(nodes(3, cpus=8))
    first = packer.allocate(single("a", node_packing_count=4))
    second = packer.allocate(single("b", node_packing_count=4))
    assert first is not None
    assert second is not None
    assert first.hostnames == second.hostnames
    assert packer.idle_node_count == 2
    assert packer.allocate(JobRequest("big", num_nodes=2)) is not None


def test_a_preferred_node_is_taken_when_the_job_fits_there_and_skipped_when_not() -> None:
    packer = NodePacker(nodes(3, cpus=2))
    cached = packer.allocate(single("a", node_packing_count=2), prefer=["n2"])
    assert cached is not None
    assert cached.hostnames == ("n2",)
    # n2's other core, although an idle node would do as well: its cache holds the input.
    again = packer.allocate(single("b", node_packing_count=2), prefer=["n2", "n1"])
    assert again is not None
    assert again.hostnames == ("n2",)
    # n2 is full now: the next preference, then any node; unknown names are ignored.
    third = packer.allocate(single("c", node_packing_count=2), prefer=["n2", "n1"])
    assert third is not None
    assert third.hostnames == ("n1",)
    assert packer.allocate(single("d"), prefer=["gone", "n2"]) is not None


def test_a_whole_node_job_does_not_land_on_a_shared_node() -> None:
    packer = NodePacker(nodes(2, cpus=8))
    shared = packer.allocate(single("s", node_packing_count=2))
    whole = packer.allocate(single("w"))
    assert shared is not None
    assert whole is not None
    assert shared.hostnames != whole.hostnames
    assert packer.allocate(single("x")) is None


def test_heterogeneous_nodes_give_small_jobs_the_smallest_idle_node() -> None:
    packer = NodePacker([*nodes(1, cpus=64, prefix="big"), *nodes(1, cpus=4, prefix="small")])
    a = packer.allocate(single("a", ranks_per_node=2))
    assert a is not None
    assert a.hostnames == ("small0",)
    b = packer.allocate(single("b", ranks_per_node=32))
    assert b is not None
    assert b.hostnames == ("big0",)


# --- multi-node -------------------------------------------------------------------------


def test_multi_node_jobs_take_whole_idle_nodes_exclusively() -> None:
    packer = NodePacker(nodes(4, cpus=8, gpus=2))
    small = packer.allocate(single("small", node_packing_count=8))
    assert small is not None
    mpi = packer.allocate(JobRequest("mpi", num_nodes=3, ranks_per_node=2))
    assert mpi is not None
    assert set(mpi.hostnames).isdisjoint(small.hostnames)
    for placement in mpi.placements:
        assert placement.cpu_ids == tuple(range(8))
        assert placement.gpu_ids == ("0", "1")
    # Every node is now busy: neither another multi-node job nor a small one on an MPI node.
    assert packer.allocate(JobRequest("mpi2", num_nodes=2)) is None
    for i in range(7):
        extra = packer.allocate(single(f"x{i}", node_packing_count=8))
        assert extra is not None
        assert extra.hostnames == small.hostnames
    assert packer.allocate(single("x7", node_packing_count=8)) is None


def test_multi_node_job_waits_for_partially_used_nodes_to_drain() -> None:
    packer = NodePacker(nodes(2, cpus=8))
    assert packer.allocate(single("a", node_packing_count=2)) is not None
    assert packer.allocate(JobRequest("mpi", num_nodes=2)) is None
    packer.release("a")
    assert packer.allocate(JobRequest("mpi", num_nodes=2)) is not None


# --- release and errors -----------------------------------------------------------------


def test_release_frees_everything_and_returns_the_allocation() -> None:
    packer = NodePacker(nodes(2, cpus=4, gpus=1))
    a = packer.allocate(single("a", ranks_per_node=4, gpus_per_rank=0))
    m = packer.allocate(JobRequest("m", num_nodes=1, gpus_per_rank=1, node_packing_count=2))
    assert a is not None
    assert m is not None
    assert packer.release("a") == a
    assert packer.release("m") == m
    assert packer.idle_node_count == 2
    for node in packer.nodes:
        assert node.is_idle
        assert not node.is_busy
        assert node.occupancy == 0.0
        assert node.idle_cpu_ids == (0, 1, 2, 3)
        assert node.busy_cpu_ids == frozenset()
        assert node.busy_gpu_ids == frozenset()
    assert packer.allocations == {}


def test_release_of_unknown_job_raises() -> None:
    packer = NodePacker(nodes(1))
    assert packer.allocate(single("a")) is not None
    packer.release("a")
    with pytest.raises(UnknownJob, match="job a holds no allocation"):
        packer.release("a")


def test_allocating_a_job_twice_is_refused() -> None:
    packer = NodePacker(nodes(2))
    assert packer.allocate(single("a", node_packing_count=4)) is not None
    with pytest.raises(InvalidRequest, match="already allocated"):
        packer.allocate(single("a", node_packing_count=4))


def test_node_assign_refuses_what_does_not_fit() -> None:
    node = ComputeNode(NodeSpec("h", (0, 1)))
    assert node.fits(2, 0, 1.0)
    assert not node.fits(3, 0, 0.1)
    assert not node.fits(0, 1, 0.1)
    node.assign("a", 1, 0, 0.5)
    assert not node.fits(0, 0, 0.6)
    with pytest.raises(InsufficientResources):
        node.assign("b", 2, 0, 0.5)
    with pytest.raises(InsufficientResources):
        node.assign("a", 1, 0, 0.5)
    assert node.placement_of("a") == NodePlacement("h", (0,), ())
    assert list(node.job_ids) == ["a"]


@pytest.mark.parametrize(
    "spec_args",
    [("", (0,), ()), ("h", (0, 0), ()), ("h", (0,), ("1", "1"))],
)
def test_node_spec_validation(spec_args: tuple[str, tuple[int, ...], tuple[str, ...]]) -> None:
    with pytest.raises(InvalidNodeSpec):
        NodeSpec(*spec_args)


def test_duplicate_hostnames_are_refused() -> None:
    with pytest.raises(InvalidNodeSpec):
        NodePacker([NodeSpec("h", (0,)), NodeSpec("h", (1,))])


# --- can_ever_fit -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (JobRequest("j", num_nodes=5), "needs 5 nodes; this pilot has 4"),
        (JobRequest("j", ranks_per_node=9), "needs 9 cpus and 0 gpus on one node"),
        (JobRequest("j", gpus_per_rank=3), "needs 1 cpus and 3 gpus on one node"),
        (JobRequest("j", num_nodes=2, ranks_per_node=2, gpus_per_rank=2), "only 0 of 4 nodes"),
    ],
)
def test_can_ever_fit_explains_impossible_requests(request_: JobRequest, reason: str) -> None:
    packer = NodePacker(nodes(4, cpus=8, gpus=2))
    explanation = packer.can_ever_fit(request_)
    assert explanation is not None
    assert reason in explanation


def test_can_ever_fit_accepts_what_merely_has_to_wait() -> None:
    packer = NodePacker(nodes(2, cpus=8, gpus=2))
    assert packer.allocate(JobRequest("all", num_nodes=2)) is not None
    for request in (
        JobRequest("a", ranks_per_node=8, gpus_per_rank=0),
        JobRequest("b", ranks_per_node=2, gpus_per_rank=1),
        JobRequest("c", num_nodes=2, ranks_per_node=16, threads_per_core=2),
    ):
        assert packer.can_ever_fit(request) is None
        assert packer.allocate(request) is None


def test_no_nodes_fit_nothing() -> None:
    assert NodePacker([]).can_ever_fit(JobRequest("j")) is not None


# --- randomized walk --------------------------------------------------------------------


def check_invariants(packer: NodePacker, requests: dict[str, JobRequest]) -> None:
    on_host: dict[str, list[tuple[str, NodePlacement]]] = {}
    for job_id, allocation in packer.allocations.items():
        request = requests[job_id]
        assert allocation.job_id == job_id
        assert len(set(allocation.hostnames)) == request.num_nodes
        for placement in allocation.placements:
            on_host.setdefault(placement.hostname, []).append((job_id, placement))
            if request.num_nodes == 1:
                assert len(placement.cpu_ids) == request.cpus_per_node
                assert len(placement.gpu_ids) == request.gpus_per_node
    for node in packer.nodes:
        held = on_host.get(node.hostname, [])
        jobs = {job_id for job_id, _ in held}
        assert set(node.job_ids) == jobs
        assert node.is_idle == (not jobs)
        cpu_use = Counter(c for _, p in held for c in p.cpu_ids)
        gpu_use = Counter(g for _, p in held for g in p.gpu_ids)
        assert max(cpu_use.values(), default=1) == 1, "a cpu id is assigned twice"
        assert max(gpu_use.values(), default=1) == 1, "a gpu id is assigned twice"
        assert set(cpu_use) == node.busy_cpu_ids
        assert set(gpu_use) == node.busy_gpu_ids
        assert set(cpu_use).isdisjoint(node.idle_cpu_ids)
        assert set(gpu_use).isdisjoint(node.idle_gpu_ids)
        assert set(cpu_use) | set(node.idle_cpu_ids) == set(node.spec.cpu_ids)
        assert set(gpu_use) | set(node.idle_gpu_ids) == set(node.spec.gpu_ids)
        assert node.occupancy == pytest.approx(sum(requests[j].occupancy for j in jobs))
        assert node.occupancy <= 1.0 + 1e-9
        if any(requests[j].num_nodes > 1 for j in jobs):
            assert len(jobs) == 1, "a multi-node job shares its node"
    assert packer.idle_node_count == sum(1 for n in packer.nodes if n.is_idle)


def could_fit_now(packer: NodePacker, request: JobRequest) -> bool:
    """Brute force, for checking that the packer never refuses what it could place."""
    if request.num_nodes == 1:
        return any(
            n.fits(request.cpus_per_node, request.gpus_per_node, request.occupancy)
            for n in packer.nodes
        )
    big_idle = [
        n
        for n in packer.nodes
        if n.is_idle
        and len(n.spec.cpu_ids) >= request.cpus_per_node
        and len(n.spec.gpu_ids) >= request.gpus_per_node
    ]
    return len(big_idle) >= request.num_nodes


def random_request(rng: random.Random, job_id: str) -> JobRequest:
    multi = rng.random() < 0.1
    return JobRequest(
        job_id,
        num_nodes=rng.randint(2, 4) if multi else 1,
        ranks_per_node=rng.choice([1, 1, 2, 4]),
        threads_per_rank=rng.choice([1, 1, 2, 3]),
        threads_per_core=rng.choice([1, 1, 2]),
        gpus_per_rank=rng.choice([0, 0, 0, 1]),
        node_packing_count=rng.choice([1, 2, 3, 4, 8, 10]),
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_allocate_release_walk_keeps_invariants(seed: int) -> None:
    rng = random.Random(seed)
    specs = [
        *nodes(4, cpus=16, gpus=4, prefix="g"),
        *nodes(3, cpus=8, gpus=0, prefix="c"),
        NodeSpec("odd", (3, 5, 7, 11), ("a", "b")),
    ]
    packer = NodePacker(specs)
    requests: dict[str, JobRequest] = {}
    for step in range(3000):
        if packer.allocations and rng.random() < 0.45:
            job_id = rng.choice(sorted(packer.allocations))
            released = packer.release(job_id)
            assert isinstance(released, Allocation)
            del requests[job_id]
        else:
            request = random_request(rng, f"j{step}")
            possible = could_fit_now(packer, request)
            allocation = packer.allocate(request)
            assert (allocation is not None) == possible, request
            if allocation is not None:
                requests[request.job_id] = request
            elif packer.can_ever_fit(request) is None:
                assert packer.allocations, "an empty pilot refused a request that can fit"
        check_invariants(packer, requests)
    for job_id in list(packer.allocations):
        packer.release(job_id)
    assert packer.idle_node_count == len(specs)
    assert all(n.occupancy == 0.0 for n in packer.nodes)
