"""A replay: raw messages in, through the shared rule and the fold, :class:`Loaded` out.

Sources hand batches of :class:`~lodestream.client.analytics.intake.Raw` messages to
:meth:`Replay.take`; nothing here knows where they came from.
"""

from __future__ import annotations

from collections.abc import Iterable

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
