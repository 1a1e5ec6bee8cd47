"""What a pilot will be, settled before it connects: its mode, its nodes, how it starts jobs.

``lode launcher`` calls :func:`plan_pilot` first. A setting this machine cannot honour is
refused here (:class:`PilotRefused`, non-zero exit), with the reason, before the pilot
reaches NATS or opens a session:

* a machine description that does not load, or nodes that cannot be discovered;
* ``mpi`` mode with an app launcher that is not an MPI launcher (the local machine's
  ``local``: set ``launcher.app_launcher``);
* an app launcher whose executable (``mpiexec``, ``srun``, ...) is not on PATH;
* ``serial_workers: mpi4py`` without mpi4py, or without an MPI launcher to start the ranks.

``srun`` gets its ``--mpi`` (PMI plugin) from ``launcher.srun_mpi`` or the machine's
``srun_mpi``: without it a cluster whose ``MpiDefault`` is none starts each rank of an MPI job
as a world of one.

Modes (docs/platforms.md, "Pilot modes"):

* ``serial``: single-rank jobs only; MPI jobs are left to the site's mpi-mode pilots. One
  process starts every job with the app launcher, or, with ``serial_workers: mpi4py`` on more
  than one node, one worker rank per node runs that node's jobs (``mpi_worker``);
* ``mpi``: any job, each started through the MPI app launcher on the nodes the packer gives
  it; a serial job is a one-rank launch.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from lodestream.agents.launcher.decide import SiteShape
from lodestream.agents.launcher.errors import PilotRefused
from lodestream.agents.launcher.mpi_ranks import job_environment
from lodestream.agents.site.settings import JobMode, SiteSettings
from lodestream.platform_adapters.compute.base import NodeSpec
from lodestream.platform_adapters.compute.discovery import discover_nodes
from lodestream.platform_adapters.compute.machine import Machine, load_machine
from lodestream.platform_adapters.errors import PlatformError
from lodestream.platform_adapters.launchers.base import AppLauncher
from lodestream.platform_adapters.launchers.mpi import MpiLauncher
from lodestream.platform_adapters.launchers.registry import get_launcher
from lodestream.platform_adapters.launchers.srun import SrunLauncher

log = logging.getLogger(__name__)

# Every virtual node of the local machine is this host; mpiexec must not ssh to "host-v1".
LOCAL_HOST = "localhost"
MPI_LAUNCHERS = "mpich, pals, openmpi, srun, aprun, jsrun or flux"


@dataclass(frozen=True, slots=True)
class PilotPlan:
    mode: JobMode
    machine: Machine
    nodes: tuple[NodeSpec, ...]  # what jobs are packed on
    app_launcher: AppLauncher  # what starts them (and, for mpi4py workers, the ranks)
    site_shape: SiteShape
    base_env: Mapping[str, str]  # what every job inherits
    # Serial mode on several nodes: one mpi4py worker rank per node (``lode launcher``
    # starts them through ``app_launcher``, and rank 0 is the pilot).
    mpi4py_workers: bool = False


def plan_pilot(
    settings: SiteSettings,
    *,
    mode: JobMode | None = None,
    environ: Mapping[str, str] | None = None,
) -> PilotPlan:
    """The pilot ``settings`` describe on this machine (``mode`` overrides theirs), or
    :class:`PilotRefused` with the reason."""
    cfg = settings.launcher
    mode = mode or cfg.mode
    env = os.environ if environ is None else environ
    try:
        machine = load_machine(cfg.machine, base=settings.directory)
        nodes = tuple(discover_nodes(
            machine, virtual_nodes=cfg.virtual_nodes, environ=env,
            cores_per_node=cfg.cores_per_node, gpus_per_node=cfg.gpus_per_node,
        ))  # fmt: skip
        name = cfg.app_launcher or machine.launcher
        local = machine.scheduler == "local"
        app_launcher = get_launcher(
            name, machine=machine, allow_options=cfg.allow_launch_options,
            host_aliases={n.hostname: LOCAL_HOST for n in nodes} if local else None,
        )  # fmt: skip
    except PlatformError as exc:
        raise PilotRefused(str(exc)) from exc
    if isinstance(app_launcher, SrunLauncher):
        app_launcher.mpi = srun_mpi(cfg.srun_mpi, machine)
    is_mpi = isinstance(app_launcher, MpiLauncher)
    workers = mode == "serial" and cfg.serial_workers == "mpi4py" and len(nodes) > 1
    if mode == "mpi" and not is_mpi:
        raise PilotRefused(
            f"mpi mode starts every job with an MPI app launcher, but this site's is {name!r} "
            f"(machine {machine.name}); set launcher.app_launcher to {MPI_LAUNCHERS}"
        )
    if workers and not is_mpi:
        raise PilotRefused(
            f"serial_workers: mpi4py starts one worker rank per node with an MPI app launcher, "
            f"but this site's is {name!r}; set launcher.app_launcher (mpich: pip's MPICH)"
        )
    if workers and importlib.util.find_spec("mpi4py") is None:
        raise PilotRefused(
            "serial_workers: mpi4py needs the mpi4py package in the pilot's Python "
            "(built against the MPI of app_launcher), which is not installed"
        )
    try:
        app_launcher.check_available()  # a missing mpiexec is one error now, not one per job
    except PlatformError as exc:
        raise PilotRefused(str(exc)) from exc
    if cfg.serial_workers == "mpi4py" and mode == "serial" and not workers:
        log.info("launcher: one node: serial_workers mpi4py not needed, one process runs it")
    return PilotPlan(
        mode=mode, machine=machine, nodes=nodes, app_launcher=app_launcher,
        site_shape=site_shape(machine, nodes), base_env=job_environment(env),
        mpi4py_workers=workers,
    )  # fmt: skip


SRUN_DEFAULT_MPI: Final = "default"
"""``launcher.srun_mpi: default``: no ``--mpi``, whatever the cluster's MpiDefault is."""


def srun_mpi(setting: str | None, machine: Machine) -> str | None:
    """srun's ``--mpi`` for the site's jobs: the site's setting, else the machine's; None
    leaves it to the cluster's ``MpiDefault``."""
    chosen = setting if setting is not None else machine.srun_mpi
    return None if chosen == SRUN_DEFAULT_MPI else chosen


def site_shape(machine: Machine, nodes: tuple[NodeSpec, ...]) -> SiteShape:
    """What every pilot of the site shares with one that has ``nodes`` on ``machine``.

    The local machine's nodes are the site's host, split as the site's settings say: every
    pilot has these. A description that states its cores fixes every node's shape (the
    site's ``cores_per_node``/``gpus_per_node`` apply to all its pilots alike); one that
    leaves them to the allocation does not (another partition may have bigger nodes).
    """
    if machine.scheduler == "local":
        described = (f"machine {machine.name}: this host as {len(nodes)} node(s), "
                     "launcher.virtual_nodes")  # fmt: skip
        return SiteShape(same_nodes=True, same_node_shape=True, described=described)
    if machine.node.cores is not None:
        return SiteShape(same_node_shape=True, described=f"machine {machine.name}'s nodes")
    return SiteShape()
