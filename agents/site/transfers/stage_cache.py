"""The site's cache of staged inputs: a source moved in once serves every later job naming it.

Falkon's data diffusion, at the site's edge: the costly move is from the remote location (a
wide-area transfer service, a beamline's storage), so an input slot the app marks ``cache``
is fetched from its location once and kept under ``<site>/cache/staged/``; a later item with
the same source is linked (hard link, or a copy across filesystems) from there into its job's
workdir instead of being transferred again, and reported ``xfer.succeeded`` with
``cached: true`` and no bytes moved. Pilots then keep node-local copies
(:mod:`lodestream.agents.launcher.cache`).

Key: the source (location, path). The remote's version cannot be read cheaply through every
backend (a Globus ``ls`` per item would cost what the cache saves), so an entry is trusted for
``stage_cache_ttl_s`` after it was fetched; experiment data is written once, and a source that
may change should not be marked ``cache``. The cache is bounded by ``stage_cache_bytes``,
least recently used first out. A copy linked into a workdir stays there whatever the cache
evicts (a hard link is a file of its own).

Only files: a ``recursive`` item (a directory) is always transferred.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

INDEX: Final = "index.json"


@dataclass(slots=True)
class Entry:
    key: str
    size: int
    fetched_at: float  # wall clock: entries outlive the agent
    used_at: float


def cache_key(location: str, path: str) -> str:
    return hashlib.sha256(f"{location}\0{path}".encode()).hexdigest()[:32]


class StageCache:
    """A bounded, persistent cache of staged input files, keyed by their source."""

    def __init__(
        self,
        root: Path,
        *,
        max_bytes: int,
        ttl_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._now = clock
        self.entries: dict[str, Entry] = {}
        self.hits = 0
        self.misses = 0
        if max_bytes > 0:
            root.mkdir(parents=True, exist_ok=True)
            self._load()

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    @property
    def size(self) -> int:
        return sum(entry.size for entry in self.entries.values())

    def lookup(self, key: str) -> Path | None:
        """The cached copy of ``key`` if there is a fresh one (counted as a hit or a miss)."""
        entry = self.entries.get(key)
        path = self.root / key
        if entry is None or self._now() - entry.fetched_at > self.ttl_s or not path.is_file():
            if entry is not None:
                self._drop(key)
            self.misses += 1
            return None
        entry.used_at = self._now()
        self.hits += 1
        return path

    def serve(self, key: str, destination: Path) -> int:
        """Put the cached copy of ``key`` at ``destination``; the bytes written (0 if linked)."""
        source = self.root / key
        destination.parent.mkdir(parents=True, exist_ok=True)
        temporary = destination.with_name(f".{destination.name}.lode-cache")
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        try:
            os.link(source, temporary)
            written = 0
        except OSError:  # another filesystem, or links not allowed: a copy
            shutil.copy2(source, temporary)
            written = source.stat().st_size
        temporary.replace(destination)
        return written

    def keep(self, key: str, staged: Path) -> None:
        """Remember the file just staged at ``staged`` as the copy of ``key``."""
        if not self.enabled or not staged.is_file():
            return
        size = staged.stat().st_size
        if size > self.max_bytes:
            return  # would evict everything and still not fit
        temporary = self.root / f".{key}.tmp"
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        try:
            os.link(staged, temporary)
        except OSError:
            shutil.copy2(staged, temporary)
        temporary.replace(self.root / key)
        now = self._now()
        self.entries[key] = Entry(key, size, now, now)
        self._evict()
        self._save()

    def _evict(self) -> None:
        total = self.size
        for entry in sorted(self.entries.values(), key=lambda e: e.used_at):
            if total <= self.max_bytes:
                break
            total -= entry.size
            self._drop(entry.key)

    def _drop(self, key: str) -> None:
        self.entries.pop(key, None)
        with contextlib.suppress(FileNotFoundError):
            (self.root / key).unlink()

    def _load(self) -> None:
        try:
            raw = json.loads((self.root / INDEX).read_text())
            self.entries = {e["key"]: Entry(**e) for e in raw if (self.root / e["key"]).is_file()}
        except FileNotFoundError:
            return
        except (ValueError, TypeError, KeyError) as exc:  # a damaged index: start afresh
            log.warning("stage cache: index unreadable (%s); starting empty", exc)
            self.entries = {}

    def _save(self) -> None:
        temporary = self.root / f".{INDEX}.tmp"
        temporary.write_text(json.dumps([asdict(e) for e in self.entries.values()]))
        temporary.replace(self.root / INDEX)
