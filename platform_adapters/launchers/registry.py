"""App launcher backends by name, as a site's settings (or its machine) name them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final

from lodestream.platform_adapters.compute.machine import Machine
from lodestream.platform_adapters.errors import UnknownBackend
from lodestream.platform_adapters.launchers.aprun import AprunLauncher
from lodestream.platform_adapters.launchers.base import CUDA_VISIBLE_DEVICES, AppLauncher
from lodestream.platform_adapters.launchers.fake import FakeLauncher
from lodestream.platform_adapters.launchers.flux import FluxLauncher
from lodestream.platform_adapters.launchers.jsrun import JsrunLauncher
from lodestream.platform_adapters.launchers.local import LocalLauncher
from lodestream.platform_adapters.launchers.mpi import MpiLauncher
from lodestream.platform_adapters.launchers.mpich import MpichLauncher
from lodestream.platform_adapters.launchers.openmpi import OpenMpiLauncher
from lodestream.platform_adapters.launchers.options import Arity
from lodestream.platform_adapters.launchers.pals import PalsLauncher
from lodestream.platform_adapters.launchers.srun import SrunLauncher

_Factory = Callable[[Machine | None, Mapping[str, Arity]], AppLauncher]


def _local(machine: Machine | None, allow_options: Mapping[str, Arity]) -> AppLauncher:
    return LocalLauncher(gpu_env=machine.gpu_env if machine else CUDA_VISIBLE_DEVICES)


def _fake(machine: Machine | None, allow_options: Mapping[str, Arity]) -> AppLauncher:
    return FakeLauncher()


def _mpi(cls: type[MpiLauncher]) -> _Factory:
    def make(machine: Machine | None, allow_options: Mapping[str, Arity]) -> AppLauncher:
        return cls(machine, allow_options=allow_options)

    return make


_BACKENDS: Final[Mapping[str, _Factory]] = MappingProxyType({
    "local": _local,
    "fake": _fake,
    "mpich": _mpi(MpichLauncher),
    "pals": _mpi(PalsLauncher),
    "openmpi": _mpi(OpenMpiLauncher),
    "srun": _mpi(SrunLauncher),
    "aprun": _mpi(AprunLauncher),
    "jsrun": _mpi(JsrunLauncher),
    "flux": _mpi(FluxLauncher),
})  # fmt: skip


def get_launcher(
    name: str,
    *,
    machine: Machine | None = None,
    allow_options: Mapping[str, Arity] | None = None,
    host_aliases: Mapping[str, str] | None = None,
) -> AppLauncher:
    """A new launcher of the backend registered as ``name``, for ``machine`` (its CPU
    numbering, GPU visibility variable and binding; the local host when None).
    ``allow_options``: further options (names without dashes, how each is read) a job's
    ``launch_params`` may use.
    ``host_aliases``: what an MPI launcher calls the nodes the pilot names otherwise
    (``MpiLauncher.host_aliases``); ignored by backends that start nothing on other hosts."""
    try:
        factory = _BACKENDS[name]
    except KeyError:
        raise UnknownBackend(
            f"no app launcher {name!r}; known: {', '.join(sorted(_BACKENDS))}"
        ) from None
    launcher = factory(machine, allow_options or {})
    if host_aliases and isinstance(launcher, MpiLauncher):
        launcher.host_aliases = MappingProxyType(dict(host_aliases))
    return launcher


def launcher_names() -> tuple[str, ...]:
    return tuple(sorted(_BACKENDS))
