"""Local node discovery and the compute backend registry."""

from __future__ import annotations

import os
import socket

import pytest

from lodestream.platform_adapters.compute import (
    NodeSpec,
    get_node_discovery,
    local_nodes,
    node_discovery_names,
    parse_cuda_visible_devices,
)
from lodestream.platform_adapters.errors import DiscoveryError, UnknownBackend


def test_default_is_this_host_with_its_usable_cores_and_no_gpus() -> None:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    (node,) = local_nodes(environ=env)
    assert node.hostname == socket.gethostname()
    assert node.cpu_ids == tuple(sorted(os.sched_getaffinity(0)))
    assert node.gpu_ids == ()


def test_gpus_come_from_cuda_visible_devices() -> None:
    (node,) = local_nodes(environ={"CUDA_VISIBLE_DEVICES": "2,3"}, usable_cpus=[0, 1])
    assert node.gpu_ids == ("2", "3")


@pytest.mark.parametrize(
    ("value", "ids"),
    [
        (None, ()),
        ("", ()),
        ("0", ("0",)),
        (" 0, 1 ,", ("0", "1")),
        ("-1", ()),
        ("0,-1,2", ("0",)),
        ("NoDevFiles", ()),
        ("0,0,1", ("0",)),
        ("GPU-5d1e2a9c,MIG-1", ("GPU-5d1e2a9c", "MIG-1")),
    ],
)
def test_parse_cuda_visible_devices_like_the_cuda_runtime(
    value: str | None, ids: tuple[str, ...]
) -> None:
    assert parse_cuda_visible_devices(value) == ids


def test_virtual_nodes_split_cores_and_gpus_without_overlap() -> None:
    specs = local_nodes(
        3,
        hostname="h",
        environ={"CUDA_VISIBLE_DEVICES": "0,1,2,3"},
        usable_cpus=[4, 5, 6, 7, 8, 9, 10],
    )
    assert specs == [
        NodeSpec("h-v0", (4, 5, 6), ("0", "1")),
        NodeSpec("h-v1", (7, 8), ("2",)),
        NodeSpec("h-v2", (9, 10), ("3",)),
    ]


def test_more_virtual_nodes_than_cores_needs_explicit_overcommit() -> None:
    with pytest.raises(DiscoveryError, match="cores_per_node to overcommit"):
        local_nodes(4, hostname="h", environ={}, usable_cpus=[0, 1])


def test_explicit_cores_per_node_overcommits_with_accounting_slots() -> None:
    specs = local_nodes(4, cores_per_node=64, hostname="h", environ={}, usable_cpus=[0, 1])
    assert [s.hostname for s in specs] == ["h-v0", "h-v1", "h-v2", "h-v3"]
    assert all(s.cpu_ids == tuple(range(64)) for s in specs)
    assert all(s.gpu_ids == () for s in specs)


def test_explicit_gpus_per_node_round_robins_visible_gpus() -> None:
    specs = local_nodes(
        3, cores_per_node=1, gpus_per_node=2, environ={"CUDA_VISIBLE_DEVICES": "4,5,6"}
    )
    assert [s.gpu_ids for s in specs] == [("4", "5"), ("6", "4"), ("5", "6")]


def test_explicit_gpus_per_node_without_visible_gpus_uses_device_indexes() -> None:
    (node,) = local_nodes(gpus_per_node=2, environ={}, usable_cpus=[0])
    assert node.gpu_ids == ("0", "1")


def test_more_gpus_per_node_than_visible_is_refused() -> None:
    with pytest.raises(DiscoveryError, match="lists 1 GPUs"):
        local_nodes(gpus_per_node=2, environ={"CUDA_VISIBLE_DEVICES": "0"}, usable_cpus=[0])


@pytest.mark.parametrize(
    "kwargs", [{"virtual_nodes": 0}, {"cores_per_node": 0}, {"gpus_per_node": -1}]
)
def test_bad_arguments_are_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises(DiscoveryError):
        local_nodes(
            kwargs.get("virtual_nodes", 1),
            kwargs.get("cores_per_node"),
            kwargs.get("gpus_per_node"),
        )


def test_registry() -> None:
    assert "local" in node_discovery_names()
    discover = get_node_discovery("local")
    specs = discover(cores_per_node=3)
    assert len(specs) == 1
    assert specs[0].cpu_ids == (0, 1, 2)
    with pytest.raises(UnknownBackend, match=r"known: .*local"):
        get_node_discovery("sge")
