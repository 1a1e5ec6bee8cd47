"""The nodes of a batch job's allocation, as each scheduler tells the job. Parsers are pure.

Each ``*_hosts`` reader takes the job's environment (and, for Flux, a command runner) and
returns one ``AllocatedHost`` per node, in the scheduler's order, without duplicates. What a
scheduler reports about a node's size (``slots``, ``cpu_ids``, ``gpu_ids``) is kept for
machines whose description leaves it open; ``discovery`` decides what wins.

* Slurm: ``SLURM_JOB_NODELIST`` (a hostlist); sizes from ``SLURM_JOB_CPUS_PER_NODE``
  (``2(x3),1``), else ``SLURM_CPUS_ON_NODE``;
* PBS: ``PBS_NODEFILE`` (one line per rank); sizes from ``NCPUS`` (PBS Pro) or
  ``PBS_NUM_PPN`` (Torque);
* LSF: ``LSB_MCPU_HOSTS`` (``hostA 4 hostB 4``), else ``LSB_HOSTS``; sizes are the slots;
* Cobalt: ``COBALT_PARTNAME`` (``1-3,7``) and the machine's node name format; no sizes;
* Flux: ``flux resource R`` (an RFC 20 resource set, version 1): core and gpu ids per node.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lodestream.platform_adapters.compute.commands import CommandRunner
from lodestream.platform_adapters.compute.hostlist import expand_counts, expand_hostlist, expand_ids
from lodestream.platform_adapters.errors import (
    AllocationNotFound,
    InvalidHostlist,
    SchedulerQueryFailed,
)

FLUX_R_COMMAND = ("flux", "resource", "R", "--states=up")


@dataclass(frozen=True, slots=True)
class AllocatedHost:
    """One node of the allocation and what the scheduler says it holds (None: not said)."""

    hostname: str
    slots: int | None = None
    cpu_ids: tuple[int, ...] | None = None
    gpu_ids: tuple[str, ...] | None = None


# --- Slurm ------------------------------------------------------------------------------------


def slurm_hosts(environ: Mapping[str, str]) -> list[AllocatedHost]:
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        raise AllocationNotFound("SLURM_JOB_NODELIST is not set: not inside a Slurm job")
    names = expand_hostlist(nodelist)
    per_node = environ.get("SLURM_JOB_CPUS_PER_NODE")
    on_node = environ.get("SLURM_CPUS_ON_NODE")
    return parse_slurm_allocation(names, per_node, on_node)


def parse_slurm_allocation(
    names: list[str], cpus_per_node: str | None, cpus_on_node: str | None = None
) -> list[AllocatedHost]:
    """Pair Slurm's node names with ``SLURM_JOB_CPUS_PER_NODE`` (one count per node)."""
    if cpus_per_node:
        counts = expand_counts(cpus_per_node)
        if len(counts) != len(names):
            raise InvalidHostlist(
                f"SLURM_JOB_CPUS_PER_NODE={cpus_per_node!r} gives {len(counts)} counts "
                f"for {len(names)} nodes"
            )
        slots: list[int | None] = list(counts)
    elif cpus_on_node:
        # Only this node's count; batch allocations are (almost always) homogeneous.
        slots = [_count(cpus_on_node, "SLURM_CPUS_ON_NODE")] * len(names)
    else:
        slots = [None] * len(names)
    return _unique(AllocatedHost(n, s) for n, s in zip(names, slots, strict=True))


# --- PBS --------------------------------------------------------------------------------------


def pbs_hosts(
    environ: Mapping[str, str], read_text: Callable[[Path], str] = Path.read_text
) -> list[AllocatedHost]:
    nodefile = environ.get("PBS_NODEFILE")
    if not nodefile:
        raise AllocationNotFound("PBS_NODEFILE is not set: not inside a PBS job")
    try:
        text = read_text(Path(nodefile))
    except OSError as exc:
        raise SchedulerQueryFailed(f"cannot read PBS_NODEFILE {nodefile}: {exc}") from exc
    ncpus = environ.get("NCPUS") or environ.get("PBS_NUM_PPN")
    slots = _count(ncpus, "NCPUS") if ncpus else None
    return [AllocatedHost(name, slots) for name in parse_pbs_nodefile(text)]


def parse_pbs_nodefile(text: str) -> list[str]:
    """Hostnames of a nodefile (one line per rank), first appearance first."""
    return list(dict.fromkeys(line.strip() for line in text.splitlines() if line.strip()))


# --- LSF --------------------------------------------------------------------------------------


def lsf_hosts(environ: Mapping[str, str], *, skip_launch_host: bool = False) -> list[AllocatedHost]:
    """LSF's hosts; ``skip_launch_host`` drops the first (a launch node, as on Summit)."""
    if mcpu := environ.get("LSB_MCPU_HOSTS"):
        hosts = parse_lsf_mcpu_hosts(mcpu)
    elif plain := environ.get("LSB_HOSTS"):
        hosts = parse_lsf_hosts(plain)
    else:
        raise AllocationNotFound("LSB_MCPU_HOSTS and LSB_HOSTS are not set: not in an LSF job")
    if skip_launch_host:
        hosts = hosts[1:]
    if not hosts:
        raise AllocationNotFound("the LSF allocation holds no compute host")
    return hosts


def parse_lsf_mcpu_hosts(text: str) -> list[AllocatedHost]:
    """``"hostA 4 hostB 4"`` → hosts with their slot counts (a host listed twice adds up)."""
    words = text.split()
    if len(words) % 2:
        raise InvalidHostlist(f"LSB_MCPU_HOSTS={text!r}: expected host/count pairs")
    slots: dict[str, int] = {}
    for host, count in zip(words[::2], words[1::2], strict=True):
        slots[host] = slots.get(host, 0) + _count(count, "LSB_MCPU_HOSTS")
    return [AllocatedHost(host, n) for host, n in slots.items()]


def parse_lsf_hosts(text: str) -> list[AllocatedHost]:
    """``"hostA hostA hostB"`` (one word per slot) → hosts with their slot counts."""
    slots: dict[str, int] = {}
    for host in text.split():
        slots[host] = slots.get(host, 0) + 1
    return [AllocatedHost(host, n) for host, n in slots.items()]


# --- Cobalt -----------------------------------------------------------------------------------


def cobalt_hosts(
    environ: Mapping[str, str], *, node_name_format: str = "nid{:05d}"
) -> list[AllocatedHost]:
    partname = environ.get("COBALT_PARTNAME")
    if not partname:
        raise AllocationNotFound("COBALT_PARTNAME is not set: not inside a Cobalt job")
    return [AllocatedHost(n) for n in parse_cobalt_partname(partname, node_name_format)]


def parse_cobalt_partname(text: str, node_name_format: str = "nid{:05d}") -> list[str]:
    """``"1-3,7"`` → ``["nid00001", "nid00002", "nid00003", "nid00007"]``."""
    return list(dict.fromkeys(node_name_format.format(n) for n in expand_ids(text)))


# --- Flux -------------------------------------------------------------------------------------


def flux_hosts(run: CommandRunner) -> list[AllocatedHost]:
    return parse_flux_r(run(FLUX_R_COMMAND))


def parse_flux_r(text: str) -> list[AllocatedHost]:
    """The nodes of an RFC 20 resource set (``R`` version 1), in broker rank order."""
    execution = _flux_execution(text)
    names: list[str] = []
    for entry in _list(execution.get("nodelist"), "nodelist"):
        names.extend(expand_hostlist(_str(entry, "nodelist entry")))
    by_rank: dict[int, AllocatedHost] = {}
    for entry in _list(execution.get("R_lite"), "R_lite"):
        if not isinstance(entry, dict):
            raise SchedulerQueryFailed("flux R: an R_lite entry is not an object")
        children = entry.get("children", {})
        if not isinstance(children, dict):
            raise SchedulerQueryFailed("flux R: R_lite children is not an object")
        cores = tuple(expand_ids(_str(children.get("core", ""), "core idset")))
        gpus = tuple(str(g) for g in expand_ids(_str(children.get("gpu", ""), "gpu idset")))
        for rank in expand_ids(_str(entry.get("rank"), "rank idset")):
            if rank >= len(names):
                raise SchedulerQueryFailed(f"flux R: rank {rank} has no name in the nodelist")
            by_rank[rank] = AllocatedHost(names[rank], len(cores), cores, gpus)
    return _unique(by_rank[rank] for rank in sorted(by_rank))


def parse_flux_nodelist(text: str) -> list[str]:
    """The hosts of ``flux resource list -n -o {nodelist}`` (one hostlist per line), in order.

    Names only; ``flux_hosts`` reads R, which also has each node's core and gpu ids.
    """
    names: list[str] = []
    for line in text.splitlines():
        names.extend(expand_hostlist(line))
    return list(dict.fromkeys(names))


def flux_expiration(text: str) -> float | None:
    """The ``expiration`` of an R (seconds since the epoch), or None when it has none (0)."""
    expiration = _flux_execution(text).get("expiration", 0)
    if not isinstance(expiration, int | float) or isinstance(expiration, bool):
        raise SchedulerQueryFailed(f"flux R: expiration {expiration!r} is not a number")
    return float(expiration) if expiration > 0 else None


def _flux_execution(text: str) -> dict[str, Any]:
    try:
        r = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchedulerQueryFailed(f"flux R is not JSON: {exc}") from exc
    if not isinstance(r, dict) or r.get("version") != 1:
        raise SchedulerQueryFailed("flux R: expected an object with version 1")
    execution = r.get("execution")
    if not isinstance(execution, dict):
        raise SchedulerQueryFailed("flux R: no execution object")
    return execution


def _list(value: object, what: str) -> list[object]:
    if not isinstance(value, list):
        raise SchedulerQueryFailed(f"flux R: {what} is not a list")
    return value


def _str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise SchedulerQueryFailed(f"flux R: {what} is not a string")
    return value


# --- shared -----------------------------------------------------------------------------------


def _count(text: str, what: str) -> int:
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()) or int(digits) < 1:
        raise InvalidHostlist(f"{what}: {text!r} is not a positive count")
    return int(digits)


def _unique(hosts: Iterable[AllocatedHost]) -> list[AllocatedHost]:
    """First appearance of each hostname wins (a list that names a node twice means one node)."""
    seen: dict[str, AllocatedHost] = {}
    for host in hosts:
        seen.setdefault(host.hostname, host)
    return list(seen.values())
