"""Node-local caches of staged inputs: Falkon's data diffusion, on the pilot's side.

An app marks an input slot ``cache=True``. The site agent stages that input into the job's
workdir as for any slot (the shared filesystem's copy); when the pilot starts the job on a
node, it offers the input through that node's cache, ``<cache_dir>/<session>/<node>/``:

* miss: the staged copy is copied into the node's cache once (these are the bytes moved);
* hit: that version of the source is there already, nothing is read from the shared copy;
* either way the staged file is set aside in the workdir and a symlink to the cached copy
  takes its place, so the job reads node-local data. When the job ends the staged copy is
  put back, so the site's hooks (on another host) see the workdir as staged.

A cached file is read-only, and pinned while a job that reads it runs: eviction (least
recently used first, by total bytes, :class:`~lodestream.agents.launcher.cache_index.LruIndex`)
never takes a file from under a running job. An input that cannot be cached (too big for the
cache, everything evictable pinned, a copy that fails) is *bypassed*: the job reads the shared
copy as it would with no cache. A cache never fails a job.

The pilot process fills every node's cache itself, so each cache directory must be writable
from where the pilot runs: true of the ``local`` machine's virtual nodes and of a one-node
pilot; ``diffusion.caches_reachable`` turns the cache off elsewhere. A cache lives as long
as its pilot session and is removed when the pilot exits (node-local disks are the next
job's).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import stat
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from lodestream.agents.launcher.cache_index import LruIndex, cache_key, source_id
from lodestream.schemas.events.session import MAX_CACHED_SOURCES
from lodestream.schemas.resources import App, JobSpec
from lodestream.schemas.xfer import local_path

log = logging.getLogger(__name__)

DIGEST_SOURCES = MAX_CACHED_SOURCES  # sources a heartbeat names at most


@dataclass(frozen=True, slots=True)
class CachedInput:
    source: str  # source_id(location, path)
    path: Path  # the staged copy, in the job's workdir


def cacheable_inputs(app: App | None, job: JobSpec, data_dir: Path) -> tuple[CachedInput, ...]:
    """The staged inputs of ``job`` its app lets the pilot cache: single files (a directory
    is not cached) of input slots declared ``cache=True``."""
    if app is None:
        return ()
    found = []
    for slot, remote in sorted(job.transfers.items()):
        defined = app.transfers.get(slot)
        if defined is None or defined.direction != "in" or not defined.cache or remote.recursive:
            continue
        try:
            where = local_path(job.workdir, defined.local_path)
        except ValueError:
            continue  # the controller stages nothing there either
        found.append(CachedInput(source_id(remote.location, remote.path), data_dir / where))
    return tuple(found)


def wanted_sources(app: App | None, job: JobSpec) -> frozenset[str]:
    """The sources of ``job``'s cacheable inputs, as heartbeats name them."""
    return frozenset(i.source for i in cacheable_inputs(app, job, Path()))


@dataclass(frozen=True, slots=True)
class CacheUse:
    """What one job's inputs cost at its node's cache."""

    node: str
    hits: int = 0
    misses: int = 0
    bytes_copied: int = 0
    bypassed: int = 0  # read from the shared copy: not cacheable, or no room


def _aside(staged: Path) -> Path:
    return staged.with_name(f".{staged.name}.lode-shared")


def restore(staged: Path) -> None:
    """Put the staged copy back where the job's symlink to a cache was (idempotent)."""
    aside = _aside(staged)
    if aside.exists() and staged.is_symlink():
        aside.replace(staged)


class NodeCache:
    """One node's cache directory and its index; thread-safe (the pilot fills it in threads)."""

    def __init__(self, node: str, root: Path, capacity: int) -> None:
        self.node = node
        self.root = root
        self._index = LruIndex(capacity)
        self._lock = threading.Lock()
        self._held: dict[str, tuple[list[str], list[Path]]] = {}  # job -> (pins, links)
        # What it holds, replaced whole under the lock and read without it: the event loop
        # asks on every delivery and must not wait for a copy in progress.
        self._sources: tuple[str, ...] = ()
        self._source_set: frozenset[str] = frozenset()

    @property
    def total_bytes(self) -> int:
        return self._index.total_bytes

    def sources(self) -> tuple[str, ...]:
        """The sources held, most recently used first (at most ``DIGEST_SOURCES``)."""
        return self._sources

    def holds(self, wanted: frozenset[str]) -> int:
        return len(wanted & self._source_set)

    def provide(self, job: str, inputs: Sequence[CachedInput]) -> CacheUse:
        """Offer each of ``inputs`` to ``job`` from this node's cache (see the module)."""
        hits = misses = copied = bypassed = 0
        pins, links = self._held.setdefault(job, ([], []))
        for wanted in inputs:
            restore(wanted.path)  # a previous attempt's pilot died before putting it back
            try:
                info = wanted.path.lstat()
            except OSError:
                bypassed += 1  # not staged: the job will say what it misses
                continue
            if not stat.S_ISREG(info.st_mode):
                bypassed += 1
                continue
            key = cache_key(wanted.source, info.st_size, info.st_mtime_ns)
            with self._lock:
                hit = self._index.touch(key) and (self.root / key).is_file()
                if not hit and not self._fill(key, wanted, info.st_size):
                    bypassed += 1
                    continue
                self._index.pin(key)
                self._sources = self._index.sources(DIGEST_SOURCES)
                self._source_set = frozenset(self._index.sources(len(self._index)))
            pins.append(key)
            if hit:
                hits += 1
            else:
                misses += 1
                copied += info.st_size
            if self._link(self.root / key, wanted.path):
                links.append(wanted.path)
        return CacheUse(self.node, hits, misses, copied, bypassed)

    def release(self, job: str) -> None:
        """The job ended: unpin its files and put its staged copies back."""
        pins, links = self._held.pop(job, ([], []))
        for path in links:
            try:
                restore(path)
            except OSError as exc:
                log.warning("cache %s: cannot restore %s: %s", self.node, path, exc)
        with self._lock:
            for key in pins:
                self._index.unpin(key)

    def _fill(self, key: str, wanted: CachedInput, size: int) -> bool:
        """Copy a missing version in (under the lock), evicting as the index says."""
        self._index.discard(key)  # a stale entry, whose file had gone
        if self._index.room_for(size) is None:
            return False
        self.root.mkdir(parents=True, exist_ok=True)
        target, partial = self.root / key, self.root / f".{key}.partial"
        try:
            shutil.copyfile(wanted.path, partial)
            partial.chmod(0o444)  # the job reads it through a symlink: it must not write it
            partial.replace(target)
        except OSError as exc:
            log.warning("cache %s: cannot cache %s: %s", self.node, wanted.path, exc)
            with contextlib.suppress(OSError):
                partial.unlink()
            return False
        evicted = self._index.admit(key, wanted.source, size)
        for victim in evicted or ():
            with contextlib.suppress(FileNotFoundError):
                (self.root / victim).unlink()
        return evicted is not None

    def _link(self, cached: Path, staged: Path) -> bool:
        aside = _aside(staged)
        try:
            staged.replace(aside)
        except OSError as exc:
            log.warning("cache %s: cannot set %s aside: %s", self.node, staged, exc)
            return False
        try:
            staged.symlink_to(cached)
        except OSError as exc:
            log.warning("cache %s: cannot link %s: %s", self.node, staged, exc)
            aside.replace(staged)
            return False
        return True


class PilotCache:
    """The caches of a pilot's nodes, under ``<cache_dir>/<session>/``."""

    def __init__(self, root: Path, nodes: Iterable[str], capacity_per_node: int) -> None:
        self.root = root
        self.nodes = {n: NodeCache(n, root / n, capacity_per_node) for n in nodes}

    def holders(self, wanted: frozenset[str]) -> list[str]:
        """Nodes holding any of ``wanted``, those holding most first (ties in node order)."""
        held = {n: c.holds(wanted) for n, c in self.nodes.items()}
        return sorted((n for n, k in held.items() if k), key=lambda n: -held[n])

    def held(self, wanted: frozenset[str]) -> int:
        """How many of ``wanted`` the best node of this pilot holds."""
        return max((c.holds(wanted) for c in self.nodes.values()), default=0)

    def digest(self) -> tuple[str, ...]:
        """The sources this pilot's nodes hold, for its heartbeat: most recent first."""
        out: dict[str, None] = {}
        for cache in self.nodes.values():
            for source in cache.sources():
                out.setdefault(source, None)
        return tuple(out)[:DIGEST_SOURCES]

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
