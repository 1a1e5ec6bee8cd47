"""Sending one client's push feed with a deadline on every write.

uvicorn's ``send`` waits, before it writes, for the socket to take what was written
before (above 64 KiB unsent, the transport pauses); a client that stops reading, with its
TCP window full, makes that wait last for ever, so a feed that only checked its own
outbox never saw it lag. Here every write has ``lag_s`` to begin: one that does not means
the client lagged, and nothing of it was written (so ``last_seq`` of the notice is the
last event the client was really sent). A write is whole frames, at most what an outbox
holds (``queue_size`` events, ``queue_bytes`` bytes, see
:mod:`~lodestream.services.api.feedbox`), so the transport holds at most that and 64 KiB
for a client, and the outbox as much again.

A client that lagged loses its feed at once (its consumer and outbox are released) and
is sent ``event: lagged``; it has ``lagged_grace_s`` to take that notice, and then the
response ends either way (a write not taken by then is dropped, and uvicorn closes the
connection once the socket has taken what it already holds).
The user's stream slot stays taken until then: a user whose clients never read cannot
open more streams than ``max_streams_per_user`` by leaving stalled ones behind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Send

from lodestream.services.api.feed import LiveFeed
from lodestream.settings import StreamSettings

SSE_HEADERS: Final = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class FeedResponse(StreamingResponse):
    def __init__(
        self, feed: LiveFeed, settings: StreamSettings, free_slot: Callable[[], None]
    ) -> None:
        self._frames = feed.frames()
        super().__init__(self._frames, media_type="text/event-stream", headers=SSE_HEADERS)
        self._feed = feed
        self._settings = settings
        self._free_slot = free_slot

    async def stream_response(self, send: Send) -> None:
        try:
            start = {"type": "http.response.start", "status": self.status_code}
            await send({**start, "headers": self.raw_headers})
            async for chunk in self._frames:
                if not await self._write(send, chunk, self._settings.lag_s):
                    break
            else:
                await self._write(send, b"", self._settings.lagged_grace_s, more=False)
                return
            # The client lagged: its feed goes now, and the notice waits for it a while.
            notice = self._feed.lagged()
            await self._release_feed()
            await self._write(send, notice, self._settings.lagged_grace_s, more=False)
        finally:
            await self._release_feed()
            self._free_slot()

    async def _release_feed(self) -> None:
        # Starlette cancels the response when the client goes; the consumer must still be
        # deleted, so the release runs shielded from that cancellation.
        with anyio.CancelScope(shield=True):
            await self._frames.aclose()
            await self._feed.close()

    @staticmethod
    async def _write(send: Send, data: bytes, patience_s: float, *, more: bool = True) -> bool:
        """Write ``data``; False when the client did not take what it was sent before within
        ``patience_s`` (then nothing of ``data`` was written)."""
        with anyio.move_on_after(patience_s) as waited:
            await send({"type": "http.response.body", "body": data, "more_body": more})
        return not waited.cancelled_caught
