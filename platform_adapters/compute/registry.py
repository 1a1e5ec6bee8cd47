"""Node discovery backends by name, as a site's settings name them."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from lodestream.platform_adapters.compute.base import NodeDiscovery
from lodestream.platform_adapters.compute.local import local_nodes
from lodestream.platform_adapters.errors import UnknownBackend

_BACKENDS: Final[Mapping[str, NodeDiscovery]] = MappingProxyType({"local": local_nodes})


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
