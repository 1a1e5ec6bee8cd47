"""One process of a split replay: its share of the range, handed to it by the parent.

:func:`replay_share` is what a spawned process runs. The parent reads the range once and
sends each process its share in chunks, as the wire gave the messages
(:func:`~lodestream.client.analytics.parallel.partition.split_wires`), then ``None`` for the
end of the range; the process parses them (sequence, subject), replays them through the
shared rule and the fold, and sends the :class:`Loaded` back on the same pipe, packed
(:mod:`.compact`), or a :class:`ShareFailure` saying why it could not. It opens no
connection of its own: the server sends every message once, to the parent.

It ends with its parent whatever happens to that one: a thread waits on the parent's end of
the spawn pipe and exits the process when it closes, and the chunks' pipe reads as ended.
Ctrl-C reaches the whole process group, so the process ignores it: the parent decides, and
stops it, without a traceback here.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import threading
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Final

from lodestream.client.analytics import intake
from lodestream.client.analytics.errors import AnalyticsError, SourceError
from lodestream.client.analytics.parallel.compact import PackedPart, pack
from lodestream.client.analytics.replay import Replay
from lodestream.client.analytics.selection import Selection
from lodestream.client.analytics.stream import raws_of
from lodestream.client.analytics.summary import Loaded
from lodestream.collector import collector_paused
from lodestream.eventlog.rawpull import Wire

# Exit statuses of a process whose parent went away (nobody wants its result): seen while
# it replayed, or only when it sent the result.
ORPHANED_EXIT: Final = 3
ORPHANED_AT_SEND_EXIT: Final = 4

Chunk = list[Wire] | None
"""What the parent sends a process: some messages of its share, or None: the range ended."""


@dataclass(frozen=True, slots=True)
class ShareTask:
    """What one process replays: share ``share`` of ``shares``, up to sequence ``last``."""

    selection: Selection
    last: int
    share: int
    shares: int


@dataclass(frozen=True, slots=True)
class ShareFailure:
    """Why a share has no result: the error's words, whether the log could not be read (a
    :class:`SourceError`) or something else failed, and the traceback of the latter."""

    message: str
    source: bool
    detail: str = ""

    def error(self) -> AnalyticsError:
        return SourceError(self.message) if self.source else AnalyticsError(self.message)


def replay_share(task: ShareTask, pipe: Connection) -> None:
    """Replay the chunks of ``task``'s share received on ``pipe`` and send the outcome back
    on it: a spawned process's target, which ends the process once it is sent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _end_with_parent()
    # The parent logs the refusals it lists once the shares are merged: they are not said
    # here too, once per process.
    logging.getLogger(intake.__name__).setLevel(logging.ERROR)
    outcome: PackedPart | ShareFailure
    # Paused until the end: pickling what the replay kept, with the collector walking all of
    # it again and again as pickling allocates, takes twice as long.
    with collector_paused():
        try:
            outcome = pack(_replay(task, pipe))
        except AnalyticsError as exc:
            outcome = ShareFailure(str(exc), isinstance(exc, SourceError))
        except Exception as exc:  # told to the parent, which says it in words
            words = f"replay process {task.share} of {task.shares} failed: {exc!r}"
            outcome = ShareFailure(words, source=False, detail=traceback.format_exc())
        try:
            with pipe:
                pipe.send(outcome)
                if isinstance(outcome, ShareFailure):
                    # Read on to the end (the parent sees the failure at its next chunk):
                    # ended with a chunk unread, the pipe would be reset, the failure lost.
                    _drain(pipe)
        except OSError:  # the parent is gone, and the watch has not woken yet
            os._exit(ORPHANED_AT_SEND_EXIT)
    # Freeing what the replay built, object by object, would take a second the parent waits
    # for when it reaps this process; nothing of it needs to be closed or written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _replay(task: ShareTask, pipe: Connection) -> Loaded:
    replay = Replay(task.selection)
    while True:
        try:
            chunk: Chunk = pipe.recv()
        except (EOFError, OSError):  # the parent closed its end without the end of the range
            os._exit(ORPHANED_EXIT)
        if chunk is None:
            return replay.loaded()
        replay.take(raws_of(chunk, task.last))


def _drain(pipe: Connection) -> None:
    try:
        while pipe.recv() is not None:
            pass
    except EOFError:  # the parent read the failure and closed its end
        return


def _end_with_parent() -> None:
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()  # its end of the pipe closes when it ends, however it ends
        os._exit(ORPHANED_EXIT)

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()
