"""Batch scheduler backends by name, as a site's settings name them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final

from lodestream.platform_adapters.errors import UnknownBackend
from lodestream.platform_adapters.schedulers.base import Scheduler
from lodestream.platform_adapters.schedulers.cobalt import CobaltScheduler
from lodestream.platform_adapters.schedulers.fake import FakeScheduler
from lodestream.platform_adapters.schedulers.flux import FluxScheduler
from lodestream.platform_adapters.schedulers.local import LocalScheduler
from lodestream.platform_adapters.schedulers.lsf import LsfScheduler
from lodestream.platform_adapters.schedulers.pbs import PbsScheduler
from lodestream.platform_adapters.schedulers.slurm import SlurmScheduler

_BACKENDS: Final[Mapping[str, Callable[..., Scheduler]]] = MappingProxyType({
    "slurm": SlurmScheduler,
    "pbs": PbsScheduler,
    "lsf": LsfScheduler,
    "cobalt": CobaltScheduler,
    "flux": FluxScheduler,
    "local": LocalScheduler,
    "fake": FakeScheduler,
})  # fmt: skip


def get_scheduler(name: str, /, *args: Any, **settings: Any) -> Scheduler:
    """A new adapter of the backend registered as ``name``, built with ``settings``.

    Each backend's constructor documents its settings (``LocalScheduler`` needs a state
    directory); a wrong one raises ``TypeError`` naming it.
    """
    try:
        factory = _BACKENDS[name]
    except KeyError:
        raise UnknownBackend(
            f"no batch scheduler {name!r}; known: {', '.join(sorted(_BACKENDS))}"
        ) from None
    return factory(*args, **settings)


def scheduler_names() -> tuple[str, ...]:
    return tuple(sorted(_BACKENDS))
