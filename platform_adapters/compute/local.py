"""Local node discovery: this host as one node, or split into virtual nodes to exercise packing.

Cores are the ones this process may run on (``os.sched_getaffinity``), not ``os.cpu_count()``:
inside a batch job or a container the two differ. GPUs are the ones listed in
``CUDA_VISIBLE_DEVICES``; when it is unset the host is taken to have none, because probing
drivers is the job of the platform-specific backends.

Virtual nodes (``virtual_nodes > 1``) are named ``<hostname>-v0``, ``<hostname>-v1``, ... and,
by default, split the host's cores and GPUs between them without overlap. Giving
``cores_per_node`` explicitly **overcommits on purpose**: every virtual node then gets cpu ids
``0 .. cores_per_node-1`` as accounting slots, whatever the host has, so packing can be tested
with, say, four 64-core nodes on a 2-core machine. Those ids are not physical cores; the local
launcher never pins tasks to them. An explicit ``gpus_per_node`` likewise hands the visible GPUs
out round-robin (virtual nodes may share a GPU), or, with no ``CUDA_VISIBLE_DEVICES``, uses device
indexes ``0 .. gpus_per_node-1``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

from lodestream.platform_adapters.compute.base import NodeSpec
from lodestream.platform_adapters.errors import DiscoveryError

_T = TypeVar("_T")

# Values Slurm and users put in CUDA_VISIBLE_DEVICES to mean "no GPUs from here on".
_NO_DEVICES = frozenset({"NoDevFiles"})


def local_nodes(
    virtual_nodes: int = 1,
    cores_per_node: int | None = None,
    gpus_per_node: int | None = None,
    *,
    hostname: str | None = None,
    environ: Mapping[str, str] | None = None,
    usable_cpus: Iterable[int] | None = None,
) -> list[NodeSpec]:
    """Describe this host as ``virtual_nodes`` nodes (see the module docstring for the rules).

    ``hostname``, ``environ`` and ``usable_cpus`` default to the real host's and exist so that
    callers (and tests) can describe a host without being on it.
    """
    if virtual_nodes < 1:
        raise DiscoveryError(f"virtual_nodes must be at least 1, not {virtual_nodes}")
    if cores_per_node is not None and cores_per_node < 1:
        raise DiscoveryError(f"cores_per_node must be at least 1, not {cores_per_node}")
    if gpus_per_node is not None and gpus_per_node < 0:
        raise DiscoveryError(f"gpus_per_node must not be negative, not {gpus_per_node}")

    host = hostname if hostname is not None else socket.gethostname()
    env = environ if environ is not None else os.environ
    cpus = sorted(usable_cpus) if usable_cpus is not None else _usable_cpus()
    gpus = parse_cuda_visible_devices(env.get("CUDA_VISIBLE_DEVICES"))

    if cores_per_node is None:
        if len(cpus) < virtual_nodes:
            raise DiscoveryError(
                f"cannot split {len(cpus)} usable cores into {virtual_nodes} virtual nodes; "
                "pass cores_per_node to overcommit them"
            )
        cpu_sets = _split(cpus, virtual_nodes)
    else:
        cpu_sets = [list(range(cores_per_node))] * virtual_nodes

    if gpus_per_node is None:
        gpu_sets = _split(list(gpus), virtual_nodes)
    elif not gpus:
        gpu_sets = [[str(i) for i in range(gpus_per_node)]] * virtual_nodes
    elif gpus_per_node > len(gpus):
        raise DiscoveryError(
            f"gpus_per_node={gpus_per_node} but CUDA_VISIBLE_DEVICES lists {len(gpus)} GPUs"
        )
    else:
        gpu_sets = [
            [gpus[(n * gpus_per_node + i) % len(gpus)] for i in range(gpus_per_node)]
            for n in range(virtual_nodes)
        ]

    names = [host] if virtual_nodes == 1 else [f"{host}-v{n}" for n in range(virtual_nodes)]
    return [
        NodeSpec(name, tuple(c), tuple(g))
        for name, c, g in zip(names, cpu_sets, gpu_sets, strict=True)
    ]


def parse_cuda_visible_devices(value: str | None) -> tuple[str, ...]:
    """The GPU ids in a ``CUDA_VISIBLE_DEVICES`` value, read the way the CUDA runtime reads it.

    CUDA stops at the first invalid entry, so ``"0,-1,2"`` means GPU 0 only and ``"-1"`` none.
    """
    if value is None:
        return ()
    ids: list[str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if not entry:
            continue
        if entry.startswith("-") or entry in _NO_DEVICES or entry in ids:
            break
        ids.append(entry)
    return tuple(ids)


def _usable_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: no affinity API, assume every core is ours
        return list(range(os.cpu_count() or 1))


def _split(items: Sequence[_T], parts: int) -> list[list[_T]]:
    """Contiguous, near-equal chunks; the first ``len % parts`` chunks get one extra item."""
    size, extra = divmod(len(items), parts)
    chunks: list[list[_T]] = []
    start = 0
    for n in range(parts):
        end = start + size + (1 if n < extra else 0)
        chunks.append(list(items[start:end]))
        start = end
    return chunks
