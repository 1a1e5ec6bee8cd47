"""Compute nodes: machine descriptions, allocation discovery backends, per-node bookkeeping."""

from lodestream.platform_adapters.compute.base import (
    ComputeNode,
    NodeDiscovery,
    NodePlacement,
    NodeSpec,
)
from lodestream.platform_adapters.compute.discovery import discover_nodes, node_specs
from lodestream.platform_adapters.compute.local import local_nodes, parse_cuda_visible_devices
from lodestream.platform_adapters.compute.machine import (
    GpuKind,
    Machine,
    load_machine,
    machine_names,
)
from lodestream.platform_adapters.compute.registry import get_node_discovery, node_discovery_names
from lodestream.platform_adapters.compute.walltime import seconds_left

__all__ = [
    "ComputeNode",
    "GpuKind",
    "Machine",
    "NodeDiscovery",
    "NodePlacement",
    "NodeSpec",
    "discover_nodes",
    "get_node_discovery",
    "load_machine",
    "local_nodes",
    "machine_names",
    "node_discovery_names",
    "node_specs",
    "parse_cuda_visible_devices",
    "seconds_left",
]
