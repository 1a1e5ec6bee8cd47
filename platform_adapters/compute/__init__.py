"""Compute nodes: discovery backends and per-node bookkeeping."""

from lodestream.platform_adapters.compute.base import (
    ComputeNode,
    NodeDiscovery,
    NodePlacement,
    NodeSpec,
)
from lodestream.platform_adapters.compute.local import local_nodes, parse_cuda_visible_devices
from lodestream.platform_adapters.compute.registry import get_node_discovery, node_discovery_names

__all__ = [
    "ComputeNode",
    "NodeDiscovery",
    "NodePlacement",
    "NodeSpec",
    "get_node_discovery",
    "local_nodes",
    "node_discovery_names",
    "parse_cuda_visible_devices",
]
