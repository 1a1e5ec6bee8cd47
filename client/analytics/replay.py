"""A replay: raw messages in, through the shared rule and the fold, :class:`Loaded` out.

Sources hand batches of :class:`~lodestream.client.analytics.intake.Raw` messages to
:meth:`Replay.take`; nothing here knows where they came from. A whole replay runs inside
:func:`collector_paused`.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterable, Iterator

from lodestream.client.analytics.fold import TimelineFold
from lodestream.client.analytics.intake import IntakeReport, Raw, accept
from lodestream.client.analytics.selection import Selection
from lodestream.client.analytics.summary import Loaded


class Replay:
    def __init__(self, selection: Selection | None = None) -> None:
        self.selection = selection or Selection()
        self.report = IntakeReport()
        self._fold = TimelineFold(self.selection, self.report)

    def take(self, raws: Iterable[Raw]) -> None:
        """Check and fold one batch of messages, in log order (any before the selection's
        start sequence are left out: a copy in a file holds them)."""
        first = self.selection.since_seq
        if first is not None:
            raws = [raw for raw in raws if raw.seq >= first]
        apply = self._fold.apply
        for seq, event in accept(raws, self.report):
            apply(seq, event)

    def loaded(self) -> Loaded:
        return Loaded(self._fold.timelines, self.report, self.selection)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a replay, and restore it after.

    A replay keeps every timeline it builds and makes many short-lived objects per event
    (each batch's decoded events). The batch's events outlive the collector's young
    generations, so every few batches a full collection walks all the timelines again:
    half the time of a replay, and more the longer the log. A replay makes no reference
    cycles (what it drops, reference counting frees at once), so the collector would find
    nothing.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
