"""How many push-feed streams each user holds open on this api, and the limit on it.

A stream costs the api a consumer (or a place in a hub), an outbox and a socket, so one
user's token must not be able to open them without end: past ``max_streams_per_user``
the api answers 429 until one of the user's streams ends. Counted per api process (each
instance of a scaled-out api has its own count), across all of the user's tokens and the
dashboard's session.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from lodestream.services.api.errors import TooMany


class StreamSlots:
    def __init__(self) -> None:
        self._held: Counter[str] = Counter()

    def held(self, user: str) -> int:
        return self._held[user]

    def take(self, user: str, limit: int) -> Callable[[], None]:
        """A slot for one more stream of ``user``, or :class:`TooMany`; the function it
        returns frees the slot (calling it again does nothing)."""
        if self._held[user] >= limit:
            raise TooMany(
                f"too many open event streams: {user!r} already has {limit}, the most one "
                "user may hold (LODE_API__STREAM__MAX_STREAMS_PER_USER); close one first, "
                "or follow several filters with one stream",
                {"open": self._held[user], "limit": limit},
            )
        self._held[user] += 1
        freed = False

        def free() -> None:
            nonlocal freed
            if freed:
                return
            freed = True
            self._held[user] -= 1
            if self._held[user] <= 0:
                del self._held[user]  # no entry left behind for a user with no stream

        return free
