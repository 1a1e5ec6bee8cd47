"""App launcher backends by name, as a site's settings name them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final

from lodestream.platform_adapters.errors import UnknownBackend
from lodestream.platform_adapters.launchers.base import AppLauncher
from lodestream.platform_adapters.launchers.fake import FakeLauncher
from lodestream.platform_adapters.launchers.local import LocalLauncher

_BACKENDS: Final[Mapping[str, Callable[[], AppLauncher]]] = MappingProxyType({
    "local": LocalLauncher,
    "fake": FakeLauncher,
})  # fmt: skip


def get_launcher(name: str) -> AppLauncher:
    """A new launcher of the backend registered as ``name``, with its defaults."""
    try:
        factory = _BACKENDS[name]
    except KeyError:
        raise UnknownBackend(
            f"no app launcher {name!r}; known: {', '.join(sorted(_BACKENDS))}"
        ) from None
    return factory()


def launcher_names() -> tuple[str, ...]:
    return tuple(sorted(_BACKENDS))
