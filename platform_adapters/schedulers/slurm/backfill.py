"""Slurm backfill windows: idle nodes (``sinfo --Node``), cut short by coming reservations.

An idle node can take a job for its partition's time limit, unless a reservation that holds it
starts sooner: then only until that start. Nodes of an active reservation are not free to us.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, tzinfo

from lodestream.platform_adapters.compute.hostlist import expand_hostlist
from lodestream.platform_adapters.schedulers.base import BackfillWindow
from lodestream.platform_adapters.schedulers.parsing import skip
from lodestream.platform_adapters.schedulers.runner import CommandResult, require_success
from lodestream.platform_adapters.schedulers.slurm.render import SINFO_NODE_FIELDS
from lodestream.platform_adapters.schedulers.timeparse import duration_s, parse_local_iso
from lodestream.platform_adapters.schedulers.windows import windows_from_free_nodes


@dataclass(frozen=True, slots=True)
class IdleNode:
    hostname: str
    partition: str
    limit_s: int | None  # the partition's time limit; None: unlimited


@dataclass(frozen=True, slots=True)
class Reservation:
    name: str
    active: bool
    start: datetime | None
    hostnames: frozenset[str]


def parse_sinfo_idle(result: CommandResult) -> list[IdleNode]:
    """``sinfo --Node --states=idle --format=%N|%R|%a|%t|%l``: idle nodes of partitions up."""
    require_success(result)
    nodes: list[IdleNode] = []
    for line in result.stdout.splitlines():
        if not line.strip():
            continue
        fields = line.strip().split("|")
        if len(fields) != len(SINFO_NODE_FIELDS):
            skip("slurm", "sinfo line", line, f"{len(fields)} fields, not {len(SINFO_NODE_FIELDS)}")
            continue
        hostname, partition, available, state, limit = fields
        # `idle~` (powered down, boots on demand) is idle too; `idle*` does not respond.
        if available != "up" or not state.startswith("idle") or state.endswith("*"):
            continue
        try:
            nodes.append(IdleNode(hostname, partition, duration_s(limit)))
        except ValueError as exc:
            skip("slurm", "sinfo line", line, exc)
    return nodes


def parse_sinfo_reservations(result: CommandResult, *, tz: tzinfo | None) -> list[Reservation]:
    """``sinfo --reservation --noheader``: name, state, start, end, duration, nodes."""
    require_success(result)
    reservations: list[Reservation] = []
    for line in result.stdout.splitlines():
        fields = line.split()
        if not fields or fields[0] == "RESV_NAME":
            continue
        if len(fields) != 6:
            skip("slurm", "reservation line", line, f"{len(fields)} fields, not 6")
            continue
        name, state, start, _end, _duration, nodelist = fields
        try:
            reservations.append(
                Reservation(
                    name=name,
                    active=state.upper() == "ACTIVE",
                    start=parse_local_iso(start, tz),
                    hostnames=frozenset(expand_hostlist(nodelist)),
                )
            )
        except ValueError as exc:
            skip("slurm", "reservation line", line, exc)
    return reservations


def slurm_windows(
    idle: Iterable[IdleNode], reservations: Iterable[Reservation], *, now: datetime
) -> list[BackfillWindow]:
    reservations = list(reservations)
    free: list[tuple[str, int | None]] = []
    for node in idle:
        limit_s = node.limit_s
        for resv in reservations:
            if node.hostname not in resv.hostnames:
                continue
            if resv.active or resv.start is None:
                limit_s = 0
                break
            until_s = int((resv.start - now).total_seconds())
            limit_s = until_s if limit_s is None else min(limit_s, until_s)
        free.append((node.partition, None if limit_s is None else max(0, limit_s) // 60))
    return windows_from_free_nodes(free)
