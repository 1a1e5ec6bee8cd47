"""What one client of the push feed is yet to be sent: chunks of frames, bounded in events
and in bytes.

Whoever feeds a client (its own consumer, or the hub of its filter) puts whole chunks —
many frames already joined — so a client of a busy log costs one append and one socket
write per batch, not per event. The bounds are ``queue_size`` events and ``queue_bytes``
bytes: :attr:`Outbox.room` says how many more events to fetch, none once either is
reached, and no more than the bytes left hold at the size of the frames put lately. Only
frames larger than those before can take it past ``queue_bytes``, by at most one fetch.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Outbox:
    def __init__(self, limit: int, limit_bytes: int) -> None:
        self.limit = limit
        self.limit_bytes = limit_bytes
        self.events = 0  # frames queued, heartbeats included
        self.bytes = 0
        self._frame_bytes = 1  # about the size of the frames put lately
        self._chunks: deque[tuple[bytes, int, int]] = deque()  # chunk, frames, newest id
        self._ready = asyncio.Event()
        self.taken = asyncio.Event()  # set whenever the client takes what is queued

    @property
    def room(self) -> int:
        if self.events >= self.limit or self.bytes >= self.limit_bytes:
            return 0
        fit = (self.limit_bytes - self.bytes) // self._frame_bytes
        return max(1, min(self.limit - self.events, fit))

    def empty(self) -> bool:
        return not self._chunks

    def put(self, chunk: bytes, frames: int, newest_id: int) -> None:
        """Queue ``frames`` frames joined in ``chunk``; ``newest_id`` 0 when none has an id."""
        self._chunks.append((chunk, frames, newest_id))
        self.events += frames
        self.bytes += len(chunk)
        # A mean that falls slowly: one fetch of small frames (a keepalive) does not open
        # the outbox to a fetch of many large ones.
        mean = max(1, len(chunk) // max(frames, 1))
        self._frame_bytes = max(mean, self._frame_bytes * 3 // 4)
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
        self.bytes = 0
        self.taken.set()
        newest = max((newest for _, _, newest in chunks), default=0)
        if len(chunks) == 1:
            return chunks[0][0], newest
        return b"".join(chunk for chunk, _, _ in chunks), newest
