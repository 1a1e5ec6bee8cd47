"""Data diffusion for one pilot: its node caches and what its peers cache, used where the
pilot offers, places, starts and ends a job.

* offer: a job whose cacheable inputs a live peer holds more of than any node here is handed
  back (bounded, :func:`~lodestream.agents.launcher.decide.cache_deferral`);
* place: a one-node job goes to the node whose cache holds most of its inputs, if it fits;
* start: its inputs are offered through that node's cache
  (:meth:`~lodestream.agents.launcher.cache.NodeCache.provide`), and what that cost goes in
  the run's result (``CacheUseData``);
* end: the node's files are unpinned and the staged copies put back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lodestream.agents.launcher import decide
from lodestream.agents.launcher.cache import (
    CacheUse,
    NodeCache,
    PilotCache,
    cacheable_inputs,
    wanted_sources,
)
from lodestream.agents.launcher.peers import PeerCaches
from lodestream.agents.launcher.report import LauncherReport
from lodestream.agents.launcher.work import WorkItem
from lodestream.platform_adapters.packing import Allocation
from lodestream.schemas.events.job import CacheUseData
from lodestream.schemas.resources import App


class Diffusion:
    def __init__(
        self,
        cache: PilotCache,
        peers: PeerCaches,
        apps: Mapping[str, App],
        data_dir: Path,
        *,
        max_deliveries: int,
        advertise: Callable[[], None] = lambda: None,
    ) -> None:
        self.cache = cache
        # Beat now: a source newly cached is worth telling the peers before the next beat,
        # or a job on it submitted in between runs elsewhere.
        self._advertise = advertise
        self.peers = peers
        self._apps = apps
        self._data_dir = data_dir
        self._max_deliveries = max_deliveries

    def placing(self, item: WorkItem) -> tuple[float | None, list[str]]:
        """(how long to hand ``item`` back for a peer, or None; the nodes to prefer here)."""
        if item.spec.num_nodes != 1:
            return None, []  # a multi-node job reads its inputs on several nodes: not cached
        wanted = wanted_sources(self._apps.get(item.spec.app), item.spec)
        if not wanted:
            return None, []
        delay = decide.cache_deferral(
            here=self.cache.held(wanted), at_peer=self.peers.best(wanted),
            delivered=_delivered(item.msg), max_deliveries=self._max_deliveries,
            defer_s=self.peers.advert_interval_s,
        )  # fmt: skip
        return delay, ([] if delay is not None else self.cache.holders(wanted))

    async def provide(self, item: WorkItem, allocation: Allocation) -> CacheUseData | None:
        node = self._node(item, allocation)
        inputs = cacheable_inputs(self._apps.get(item.spec.app), item.spec, self._data_dir)
        if node is None or not inputs:
            return None
        use = await asyncio.to_thread(node.provide, str(item.job_id), inputs)
        if use.misses:
            self._advertise()
        return use_data(use)

    async def release(self, item: WorkItem, allocation: Allocation) -> None:
        node = self._node(item, allocation)
        if node is not None:
            await asyncio.to_thread(node.release, str(item.job_id))

    def _node(self, item: WorkItem, allocation: Allocation) -> NodeCache | None:
        if item.spec.num_nodes != 1 or len(allocation.placements) != 1:
            return None
        return self.cache.nodes.get(allocation.placements[0].hostname)


def use_data(use: CacheUse) -> CacheUseData:
    return CacheUseData(node=use.node, hits=use.hits, misses=use.misses,
                        bytes_copied=use.bytes_copied, bypassed=use.bypassed)  # fmt: skip


def count(report: LauncherReport, use: CacheUseData | None) -> None:
    if use is not None:
        report.cache_hits += use.hits
        report.cache_misses += use.misses
        report.cache_bytes_copied += use.bytes_copied


def _delivered(msg: Any) -> int:
    """The delivery's count, as the server keeps it (1 on the first)."""
    try:
        return int(msg.metadata.num_delivered)
    except (AttributeError, TypeError, ValueError):
        return 1


def caches_reachable(scheduler: str, nodes: int, mpi4py_workers: bool) -> bool:
    """Whether this pilot's process can fill every node's cache itself: the ``local``
    machine's virtual nodes are all this host, and a one-node pilot runs on its node. On
    other nodes (and with mpi4py workers, which run jobs from their own nodes) the caches
    would have to be filled on each node; not done yet, so caching is off there."""
    return not mpi4py_workers and (scheduler == "local" or nodes == 1)


def build(
    *,
    cache_root: Path,
    capacity: int,
    nodes: list[str],
    peers: PeerCaches,
    apps: Mapping[str, App],
    data_dir: Path,
    max_deliveries: int,
    advertise: Callable[[], None] = lambda: None,
) -> Diffusion:
    cache = PilotCache(cache_root, nodes, capacity)
    return Diffusion(
        cache, peers, apps, data_dir, max_deliveries=max_deliveries, advertise=advertise
    )
