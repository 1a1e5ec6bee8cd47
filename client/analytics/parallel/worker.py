"""One process of a split replay: its share of the range, handed to it by the parent.

:func:`replay_share` is what a spawned process runs (:func:`lodestream.shares.serve`). The
parent reads the range once and sends each process its share in chunks, as the wire gave
the messages (:func:`~lodestream.client.analytics.parallel.partition.split_wires`), then
``None`` for the end of the range; the process parses them (sequence, subject), replays
them through the shared rule and the fold, and sends the :class:`Loaded` back, packed
(:mod:`.compact`), or a :class:`~lodestream.shares.ShareFailure` saying why it could not. It
opens no connection of its own: the server sends every message once, to the parent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Final

from lodestream.client.analytics import intake
from lodestream.client.analytics.errors import AnalyticsError, SourceError
from lodestream.client.analytics.parallel.compact import pack
from lodestream.client.analytics.replay import Replay
from lodestream.client.analytics.selection import Selection
from lodestream.client.analytics.stream import raws_of
from lodestream.client.analytics.summary import Loaded
from lodestream.eventlog.rawpull import Wire
from lodestream.shares import ORPHANED_EXIT, Receive, ShareFailure, serve, unexpected

__all__ = ["ORPHANED_EXIT", "SOURCE", "Chunk", "ShareTask", "replay_share"]

SOURCE: Final = "source"
"""The failure's kind when the log could not be read (a :class:`SourceError`)."""

Chunk = list[Wire] | None
"""What the parent sends a process: some messages of its share, or None: the range ended."""


@dataclass(frozen=True, slots=True)
class ShareTask:
    """What one process replays: share ``share`` of ``shares``, up to sequence ``last``."""

    selection: Selection
    last: int
    share: int
    shares: int


def replay_share(task: ShareTask, pipe: Connection) -> None:
    """Replay the chunks of ``task``'s share received on ``pipe`` and send the outcome back
    on it: a spawned process's target, which ends the process once it is sent."""
    # The parent logs the refusals it lists once the shares are merged: they are not said
    # here too, once per process.
    logging.getLogger(intake.__name__).setLevel(logging.ERROR)

    def failure(exc: Exception) -> ShareFailure:
        if isinstance(exc, AnalyticsError):
            return ShareFailure(str(exc), SOURCE if isinstance(exc, SourceError) else "")
        return unexpected(f"replay process {task.share} of {task.shares} failed", exc)

    serve(pipe, lambda receive: pack(_replay(task, receive)), failure)


def _replay(task: ShareTask, receive: Receive) -> Loaded:
    replay = Replay(task.selection)
    while (chunk := receive()) is not None:
        replay.take(raws_of(chunk, task.last))
    return replay.loaded()
