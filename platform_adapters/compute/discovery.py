"""Node discovery for batch allocations: the scheduler's node list + the machine's node shape.

``discover_nodes(machine, ...)`` is what the pilot calls: it reads the allocation of the
machine's scheduler and returns one ``NodeSpec`` per node. Per node:

* **cpu ids** are the machine's usable cores (``0 .. cores-1`` less the reserved ones). A
  machine that leaves ``cores`` open (a generic cluster) takes what the allocation reports:
  Flux's core ids, or ``range(slots // threads_per_core)`` from Slurm's CPU counts, LSF's slots,
  PBS's ``NCPUS``. ``cores_per_node`` (site settings) takes the first that many of those, or
  ``range(cores_per_node)`` when nothing is known;
* **gpu ids** are the machine's (``0 .. count*tiles-1``), else what Flux reports, else none;
  ``gpus_per_node`` takes the first that many (or ``0 .. n-1`` when none are known).

The ``*_nodes`` functions satisfy ``NodeDiscovery`` for the registry; each takes the machine
and the environment as keyword options so that tests describe an allocation without one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from lodestream.platform_adapters.compute.allocation import (
    AllocatedHost,
    cobalt_hosts,
    flux_hosts,
    lsf_hosts,
    pbs_hosts,
    slurm_hosts,
)
from lodestream.platform_adapters.compute.base import NodeSpec
from lodestream.platform_adapters.compute.commands import CommandRunner, run_command
from lodestream.platform_adapters.compute.local import local_nodes
from lodestream.platform_adapters.compute.machine import (
    Machine,
    Scheduler,
    load_machine,
    machine_names,
)
from lodestream.platform_adapters.errors import DiscoveryError

# The launcher of the machine a backend assumes when none is named (sizes from the allocation).
_GENERIC_LAUNCHER: dict[Scheduler, str] = {
    "local": "local",
    "slurm": "srun",
    "pbs": "mpich",
    "lsf": "jsrun",
    "cobalt": "aprun",
    "flux": "flux",
}


def node_specs(
    hosts: Sequence[AllocatedHost],
    machine: Machine,
    *,
    cores_per_node: int | None = None,
    gpus_per_node: int | None = None,
) -> list[NodeSpec]:
    """One ``NodeSpec`` per allocated host (rules in the module docstring)."""
    if cores_per_node is not None and cores_per_node < 1:
        raise DiscoveryError(f"cores_per_node must be at least 1, not {cores_per_node}")
    if gpus_per_node is not None and gpus_per_node < 0:
        raise DiscoveryError(f"gpus_per_node must not be negative, not {gpus_per_node}")
    if not hosts:
        raise DiscoveryError(f"{machine.name}: the allocation holds no nodes")
    return [
        NodeSpec(
            host.hostname,
            _cpu_ids(host, machine, cores_per_node),
            _gpu_ids(host, machine, gpus_per_node),
        )
        for host in hosts
    ]


def slurm_nodes(
    *,
    cores_per_node: int | None = None,
    gpus_per_node: int | None = None,
    machine: Machine | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[NodeSpec]:
    return _nodes("slurm", machine, cores_per_node, gpus_per_node, environ=environ)


def pbs_nodes(
    *,
    cores_per_node: int | None = None,
    gpus_per_node: int | None = None,
    machine: Machine | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[NodeSpec]:
    return _nodes("pbs", machine, cores_per_node, gpus_per_node, environ=environ)


def lsf_nodes(
    *,
    cores_per_node: int | None = None,
    gpus_per_node: int | None = None,
    machine: Machine | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[NodeSpec]:
    return _nodes("lsf", machine, cores_per_node, gpus_per_node, environ=environ)


def cobalt_nodes(
    *,
    cores_per_node: int | None = None,
    gpus_per_node: int | None = None,
    machine: Machine | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[NodeSpec]:
    return _nodes("cobalt", machine, cores_per_node, gpus_per_node, environ=environ)


def flux_nodes(
    *,
    cores_per_node: int | None = None,
    gpus_per_node: int | None = None,
    machine: Machine | None = None,
    run: CommandRunner = run_command,
) -> list[NodeSpec]:
    return _nodes("flux", machine, cores_per_node, gpus_per_node, run=run)


def discover_nodes(
    machine: Machine,
    *,
    virtual_nodes: int = 1,
    cores_per_node: int | None = None,
    gpus_per_node: int | None = None,
    environ: Mapping[str, str] | None = None,
    run: CommandRunner = run_command,
) -> list[NodeSpec]:
    """The pilot's nodes on ``machine``; ``virtual_nodes`` applies to the local machine only."""
    if machine.scheduler == "local":
        return local_nodes(virtual_nodes, cores_per_node, gpus_per_node, environ=environ)
    if virtual_nodes != 1:
        raise DiscoveryError(
            f"virtual_nodes={virtual_nodes} splits this host, but machine {machine.name} takes "
            f"its nodes from the {machine.scheduler} allocation"
        )
    return _nodes(
        machine.scheduler, machine, cores_per_node, gpus_per_node, environ=environ, run=run
    )


def _nodes(
    scheduler: Scheduler,
    machine: Machine | None,
    cores_per_node: int | None,
    gpus_per_node: int | None,
    *,
    environ: Mapping[str, str] | None = None,
    run: CommandRunner = run_command,
) -> list[NodeSpec]:
    """The allocation of ``scheduler`` described with ``machine`` (a generic one if None)."""
    machine = machine or _generic(scheduler)
    env = environ if environ is not None else os.environ
    hosts: list[AllocatedHost]
    if scheduler == "slurm":
        hosts = slurm_hosts(env)
    elif scheduler == "pbs":
        hosts = pbs_hosts(env)
    elif scheduler == "lsf":
        hosts = lsf_hosts(env, skip_launch_host=machine.skip_launch_host)
    elif scheduler == "cobalt":
        hosts = cobalt_hosts(env, node_name_format=machine.node_name_format)
    elif scheduler == "flux":
        hosts = flux_hosts(run)
    else:
        raise DiscoveryError(f"no allocation to read for scheduler {scheduler!r}")
    return node_specs(hosts, machine, cores_per_node=cores_per_node, gpus_per_node=gpus_per_node)


def _cpu_ids(host: AllocatedHost, machine: Machine, wanted: int | None) -> tuple[int, ...]:
    usable = machine.node.usable_core_ids
    if usable is None:
        if host.cpu_ids is not None:
            usable = host.cpu_ids
        elif host.slots is not None:
            usable = tuple(range(max(1, host.slots // machine.node.threads_per_core)))
    if wanted is None:
        if usable is None:
            raise DiscoveryError(
                f"{machine.name}: the {machine.scheduler} allocation does not say how many "
                f"cores {host.hostname} has; set the site's cores_per_node or describe the machine"
            )
        return usable
    if usable is None:
        return tuple(range(wanted))
    if wanted > len(usable):
        raise DiscoveryError(
            f"cores_per_node={wanted} but {host.hostname} has {len(usable)} usable cores"
        )
    return usable[:wanted]


def _gpu_ids(host: AllocatedHost, machine: Machine, wanted: int | None) -> tuple[str, ...]:
    known = machine.gpu_ids or host.gpu_ids or ()
    if wanted is None:
        return known
    if not known:
        return tuple(str(i) for i in range(wanted))
    if wanted > len(known):
        raise DiscoveryError(f"gpus_per_node={wanted} but {host.hostname} has {len(known)} GPUs")
    return known[:wanted]


def _generic(scheduler: Scheduler) -> Machine:
    name = f"generic-{scheduler}"
    if name in machine_names():
        return load_machine(name)
    return Machine(name=name, scheduler=scheduler, launcher=_GENERIC_LAUNCHER[scheduler])
