"""Transfer backends by the scheme of a location's URL, as a site's settings name them."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from lodestream.platform_adapters.errors import UnknownBackend
from lodestream.platform_adapters.transfers.base import TransferBackend

# scheme -> (module, class). Modules are imported when a location needs them, so a site
# without Globus locations never imports the Globus SDK.
_BACKENDS: Final[Mapping[str, tuple[str, str]]] = MappingProxyType({
    "local": ("lodestream.platform_adapters.transfers.local", "LocalBackend"),
    "rsync": ("lodestream.platform_adapters.transfers.rsync", "RsyncBackend"),
    "globus": ("lodestream.platform_adapters.transfers.globus", "GlobusBackend"),
})  # fmt: skip


def backend_for(url: str, /, **site_options: Any) -> TransferBackend:
    """A new backend for the location at ``url``: ``Backend(url, **site_options)``.

    Each backend's constructor documents its options (the local and rsync ones need
    ``state_dir``); a wrong one raises ``TypeError`` naming it, a malformed URL
    ``TransferRefused``, a scheme no backend serves ``UnknownBackend``.
    """
    scheme, colon, _ = url.partition(":")
    entry = _BACKENDS.get(scheme.lower()) if colon else None
    if entry is None:
        raise UnknownBackend(
            f"no transfer backend for {url!r}; known schemes: {', '.join(transfer_schemes())}"
        )
    module_name, class_name = entry
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise  # the backend is there, something it needs is not: say that, not this
        raise UnknownBackend(
            f"the {scheme} transfer backend ({module_name}) is not installed"
        ) from exc
    backend: TransferBackend = getattr(module, class_name)(url, **site_options)
    return backend


def transfer_schemes() -> tuple[str, ...]:
    return tuple(sorted(_BACKENDS))
