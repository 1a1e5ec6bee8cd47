"""The bookkeeping of one node's cache, with no I/O: keys, sizes, recency and pins.

:class:`LruIndex` says what a node cache holds and what to evict to make room, so the
bound can be tested as an invariant (``total_bytes <= capacity`` after every operation) apart
from the files (:mod:`~lodestream.agents.launcher.cache`) that follow what it decides.

A key names one *version* of one source: the source (a transfer location and a path on it)
and the staged copy's size and modification time, the quick check rsync makes. A source
changed at its location is staged with another size or mtime, so it is a new key and the
old one ages out; a staging backend that does not keep modification times only costs hits,
never a wrong one (unless a file changes without changing size or mtime, which rsync would
miss too).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

SOURCE_ID_CHARS = 16  # of a sha256: what heartbeats carry for a source (64 bits)


def source_id(location: str, path: str) -> str:
    """A short, stable name for a file at a transfer location (what pilots tell each other)."""
    text = f"{location}\x00{path}".encode()
    return hashlib.sha256(text).hexdigest()[:SOURCE_ID_CHARS]


def cache_key(source: str, size: int, mtime_ns: int) -> str:
    """The key of one version of ``source``: it is also the cached file's name."""
    return hashlib.sha256(f"{source}:{size}:{mtime_ns}".encode()).hexdigest()[:32]


@dataclass(slots=True)
class Entry:
    source: str
    size: int
    pins: int = 0  # jobs running on it: never evicted while > 0


class LruIndex:
    """What a cache of ``capacity`` bytes holds, least recently used first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = capacity
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        self.total_bytes = 0

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def touch(self, key: str) -> bool:
        """Mark ``key`` used now; False if it is not held."""
        if key not in self._entries:
            return False
        self._entries.move_to_end(key)
        return True

    def room_for(self, size: int) -> list[str] | None:
        """The keys to evict, oldest first, so that ``size`` more bytes fit; None if they
        cannot (bigger than the cache, or what would have to go is pinned). Changes nothing."""
        if size > self.capacity:
            return None
        need = self.total_bytes + size - self.capacity
        victims: list[str] = []
        for key, entry in self._entries.items():
            if need <= 0:
                break
            if entry.pins == 0:
                victims.append(key)
                need -= entry.size
        return victims if need <= 0 else None

    def admit(self, key: str, source: str, size: int) -> list[str] | None:
        """Hold ``key`` (most recent), evicting what :meth:`room_for` names; returns the
        evicted keys, or None (nothing changed) if it does not fit."""
        if key in self._entries:
            self.touch(key)
            return []
        victims = self.room_for(size)
        if victims is None:
            return None
        for victim in victims:
            self.total_bytes -= self._entries.pop(victim).size
        self._entries[key] = Entry(source, size)
        self.total_bytes += size
        return victims

    def discard(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.total_bytes -= entry.size

    def pin(self, key: str) -> None:
        self._entries[key].pins += 1

    def unpin(self, key: str) -> None:
        entry = self._entries.get(key)
        if entry is not None and entry.pins > 0:
            entry.pins -= 1

    def pinned(self, key: str) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.pins > 0

    def sources(self, limit: int) -> tuple[str, ...]:
        """The sources held, most recently used first, at most ``limit`` of them."""
        seen: dict[str, None] = {}
        for entry in reversed(self._entries.values()):
            if len(seen) >= limit:
                break
            seen.setdefault(entry.source, None)
        return tuple(seen)
