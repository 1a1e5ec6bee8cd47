"""Machine descriptions: what one compute node of a named machine holds, as data.

Each machine is a YAML file in ``compute/machines/`` (packaged with lodestream), validated by
``Machine``. A site's settings name one (``launcher.machine: polaris``) or give the path of
their own file. Node discovery combines the description with the node list the scheduler
gives the batch job; app launchers read it for CPU numbering and the GPU visibility variable.

    name: polaris
    description: ALCF Polaris ...
    scheduler: pbs              # which allocation discovery reads (local, slurm, pbs, ...)
    launcher: pals              # the app launcher a pilot uses by default
    cpu_bind: placement         # how MPI ranks are bound: auto | placement | none
    node:
      cores: 32                 # physical cores per node, reserved ones included
      sockets: 1
      threads_per_core: 2       # hardware threads per core
      reserved_cores: []        # cores the system keeps (never handed to jobs)
      gpus: {kind: nvidia, count: 4}

A machine whose launcher is ``srun`` also says which PMI its MPI jobs need (``srun_mpi:
pmi2``; a site's ``launcher.srun_mpi`` overrides it). ``cores: null`` means "whatever the
allocation reports" (a generic cluster). Core ids are
``0 .. cores-1``; hardware thread ``t`` of core ``c`` is logical CPU ``c + t * cores``
(``cpu_numbering: stride``, as Linux numbers x86 nodes) or ``c * threads_per_core + t``
(``adjacent``, as on POWER).
"""

from __future__ import annotations

import functools
import importlib.resources
from enum import StrEnum
from pathlib import Path
from typing import Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from lodestream.platform_adapters.errors import InvalidMachine

MACHINES_PACKAGE: Final = "lodestream.platform_adapters.compute.machines"
DEFAULT_MACHINE: Final = "local"

Scheduler = Literal["local", "slurm", "pbs", "lsf", "cobalt", "flux"]
CpuBind = Literal["auto", "placement", "none"]
# One of srun's --mpi plugin names (pmi2, pmix, pmix_v4, cray_shasta, none).
SRUN_MPI_PATTERN: Final = r"^[a-z][a-z0-9_]{0,31}$"

# One integer field (``{:05d}``) between hostname characters: nothing else for str.format to read.
_NODE_NAME_FORMAT = r"^[A-Za-z0-9_.-]*\{:0?\d*d\}[A-Za-z0-9_.-]*$"


class GpuKind(StrEnum):
    NVIDIA = "nvidia"
    AMD = "amd"
    INTEL = "intel"


# The variable each vendor's runtime reads to restrict a process to some devices.
GPU_VISIBILITY: Final = {
    GpuKind.NVIDIA: "CUDA_VISIBLE_DEVICES",
    GpuKind.AMD: "ROCR_VISIBLE_DEVICES",
    GpuKind.INTEL: "ZE_AFFINITY_MASK",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuDescription(_Strict):
    """The GPUs of one node. Multi-tile GPUs (Intel Max) count one id per tile.

    ``ids`` default to ``0 .. count*tiles_per_gpu - 1``: in Level Zero's FLAT hierarchy (the
    default since 2023) every tile is a device and ``ZE_AFFINITY_MASK`` takes those indexes.
    A machine run in COMPOSITE mode lists ``"0.0", "0.1", ...`` explicitly.
    """

    kind: GpuKind
    count: int = Field(ge=1, le=64)
    tiles_per_gpu: int = Field(1, ge=1, le=8)
    ids: tuple[str, ...] | None = None

    @property
    def visible_ids(self) -> tuple[str, ...]:
        if self.ids is not None:
            return self.ids
        return tuple(str(i) for i in range(self.count * self.tiles_per_gpu))

    @model_validator(mode="after")
    def _consistent_ids(self) -> GpuDescription:
        if self.ids is not None:
            if len(self.ids) != self.count * self.tiles_per_gpu:
                raise ValueError(
                    f"{len(self.ids)} gpu ids for {self.count} GPUs of {self.tiles_per_gpu} "
                    "tile(s) each"
                )
            if len(set(self.ids)) != len(self.ids) or not all(self.ids):
                raise ValueError("gpu ids must be unique and non-empty")
        return self


class NodeDescription(_Strict):
    cores: int | None = Field(None, ge=1, le=4096)
    sockets: int = Field(1, ge=1, le=16)
    threads_per_core: Literal[1, 2, 4, 8] = 1
    reserved_cores: tuple[int, ...] = ()
    cpu_numbering: Literal["stride", "adjacent"] = "stride"
    gpus: GpuDescription | None = None

    @model_validator(mode="after")
    def _consistent_cores(self) -> NodeDescription:
        if self.cores is None:
            if self.reserved_cores:
                raise ValueError("reserved_cores needs cores")
            return self
        if self.cores % self.sockets:
            raise ValueError(f"{self.cores} cores do not split evenly over {self.sockets} sockets")
        if len(set(self.reserved_cores)) != len(self.reserved_cores):
            raise ValueError("reserved_cores are not unique")
        if any(not 0 <= c < self.cores for c in self.reserved_cores):
            raise ValueError(f"reserved_cores must be core ids in 0..{self.cores - 1}")
        if len(self.reserved_cores) >= self.cores:
            raise ValueError("reserved_cores leave no core for jobs")
        return self

    @property
    def usable_core_ids(self) -> tuple[int, ...] | None:
        """Core ids jobs may use (all but the reserved), or None when the allocation says."""
        if self.cores is None:
            return None
        reserved = set(self.reserved_cores)
        return tuple(c for c in range(self.cores) if c not in reserved)

    def logical_cpus(self, core: int, threads: int) -> tuple[int, ...]:
        """The first ``threads`` logical CPU ids of ``core`` (its hardware threads)."""
        threads = max(1, min(threads, self.threads_per_core))
        if self.threads_per_core == 1 or threads == 1:
            return (core * self.threads_per_core if self.cpu_numbering == "adjacent" else core,)
        if self.cpu_numbering == "adjacent":
            return tuple(core * self.threads_per_core + t for t in range(threads))
        if self.cores is None:  # a stride needs the core count; without it, no siblings
            return (core,)
        return tuple(core + t * self.cores for t in range(threads))


class Machine(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    description: str = ""
    scheduler: Scheduler
    launcher: str = Field(pattern=r"^[a-z][a-z0-9-]{0,31}$")
    cpu_bind: CpuBind = "auto"
    # srun's ``--mpi`` (its PMI plugin) for MPI jobs: a cluster whose ``MpiDefault`` is none
    # starts every rank as a world of its own without it. None: the cluster's MpiDefault.
    srun_mpi: str | None = Field(None, pattern=SRUN_MPI_PATTERN)
    node: NodeDescription = NodeDescription()
    # LSF (Summit-like): the first host of LSB_MCPU_HOSTS is the launch node, not a compute node.
    skip_launch_host: bool = False
    # Cobalt: how a node number of COBALT_PARTNAME becomes a hostname.
    node_name_format: str = Field("nid{:05d}", pattern=_NODE_NAME_FORMAT)

    @property
    def gpu_env(self) -> str:
        """The variable that restricts a task to its GPUs on this machine."""
        kind = self.node.gpus.kind if self.node.gpus is not None else GpuKind.NVIDIA
        return GPU_VISIBILITY[kind]

    @property
    def gpu_ids(self) -> tuple[str, ...]:
        return self.node.gpus.visible_ids if self.node.gpus is not None else ()


def machine_names() -> tuple[str, ...]:
    """The machines shipped with lodestream."""
    folder = importlib.resources.files(MACHINES_PACKAGE)
    return tuple(sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml")))


def load_machine(name_or_path: str | Path, *, base: Path | None = None) -> Machine:
    """A packaged machine by name (``"polaris"``), or a description file by path.

    A value with a ``/`` or ending in ``.yaml``/``.yml`` is a path, relative to ``base`` (the
    site directory) when not absolute.
    """
    text = str(name_or_path)
    if "/" in text or text.endswith((".yaml", ".yml")):
        path = Path(text)
        if not path.is_absolute() and base is not None:
            path = base / path
        try:
            raw = path.read_text()
        except OSError as exc:
            raise InvalidMachine(f"machine file {path}: {exc.strerror or exc}") from exc
        return parse_machine(raw, source=str(path))
    return _packaged(text)


def parse_machine(text: str, *, source: str, expect_name: str | None = None) -> Machine:
    """Validate one description; errors name ``source`` and the failing fields."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidMachine(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise InvalidMachine(f"{source}: expected a mapping, got {type(raw).__name__}")
    try:
        machine = Machine.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}"
            for err in exc.errors()
        )
        raise InvalidMachine(f"{source}: {problems}") from exc
    if expect_name is not None and machine.name != expect_name:
        raise InvalidMachine(f"{source}: names machine {machine.name!r}, not {expect_name!r}")
    return machine


@functools.cache
def _packaged(name: str) -> Machine:
    known = machine_names()
    if name not in known:
        raise InvalidMachine(f"no machine {name!r}; known: {', '.join(known)}")
    resource = importlib.resources.files(MACHINES_PACKAGE) / f"{name}.yaml"
    return parse_machine(resource.read_text(), source=f"machines/{name}.yaml", expect_name=name)
