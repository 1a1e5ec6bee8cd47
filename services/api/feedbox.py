"""What one client of the push feed is yet to be sent: chunks of frames, bounded in events.

Whoever feeds a client (its own consumer, or the hub of its filter) puts whole chunks —
many frames already joined — so a client of a busy log costs one append and one socket
write per batch, not per event. The bound is in events, the unit ``queue_size`` names.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Outbox:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.events = 0  # frames queued, heartbeats included
        self._chunks: deque[tuple[bytes, int, int]] = deque()  # chunk, frames, newest id
        self._ready = asyncio.Event()
        self.taken = asyncio.Event()  # set whenever the client takes what is queued

    @property
    def room(self) -> int:
        return self.limit - self.events

    def empty(self) -> bool:
        return not self._chunks

    def put(self, chunk: bytes, frames: int, newest_id: int) -> None:
        """Queue ``frames`` frames joined in ``chunk``; ``newest_id`` 0 when none has an id."""
        self._chunks.append((chunk, frames, newest_id))
        self.events += frames
        self._ready.set()

    def wake(self) -> None:
        """Wake :meth:`take` with nothing queued (the feed's state changed)."""
        self._ready.set()

    async def take(self) -> tuple[bytes, int]:
        """Everything queued, joined, and the newest id in it (0: none); b"" when woken."""
        await self._ready.wait()
        self._ready.clear()
        chunks, self._chunks = self._chunks, deque()
        self.events = 0
        self.taken.set()
        newest = max((newest for _, _, newest in chunks), default=0)
        if len(chunks) == 1:
            return chunks[0][0], newest
        return b"".join(chunk for chunk, _, _ in chunks), newest
