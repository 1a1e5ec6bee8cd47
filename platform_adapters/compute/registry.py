"""Node discovery backends by name, as a site's settings name them.

Each is keyed by the scheduler whose allocation it reads; ``discovery.discover_nodes`` picks
one from a machine description, which is how the pilot uses them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from lodestream.platform_adapters.compute.base import NodeDiscovery
from lodestream.platform_adapters.compute.discovery import (
    cobalt_nodes,
    flux_nodes,
    lsf_nodes,
    pbs_nodes,
    slurm_nodes,
)
from lodestream.platform_adapters.compute.local import local_nodes
from lodestream.platform_adapters.errors import UnknownBackend

_BACKENDS: Final[Mapping[str, NodeDiscovery]] = MappingProxyType({
    "local": local_nodes,
    "slurm": slurm_nodes,
    "pbs": pbs_nodes,
    "lsf": lsf_nodes,
    "cobalt": cobalt_nodes,
    "flux": flux_nodes,
})  # fmt: skip


def get_node_discovery(name: str) -> NodeDiscovery:
    """The discovery function registered as ``name``; ``UnknownBackend`` lists the known ones."""
    try:
        return _BACKENDS[name]
    except KeyError:
        raise UnknownBackend(
            f"no compute backend {name!r}; known: {', '.join(sorted(_BACKENDS))}"
        ) from None


def node_discovery_names() -> tuple[str, ...]:
    return tuple(sorted(_BACKENDS))
