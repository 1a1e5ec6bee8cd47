"""Where every message of the log enters the analytics: the shared rule, and what it refused.

Whatever the source (a live stream, a copy in a file), each message is decoded and checked
with :func:`lodestream.schemas.trust.event_from_message`, as every other consumer of the log
does. A message it refuses is skipped, logged and counted in :class:`IntakeReport`, and the
:data:`MAX_LISTED` of lowest sequence are kept with their reason so a report can list them:
one bad event never stops an analysis. Lowest sequence, not first refused: the shared rule
judges a whole batch before the fold judges its transitions, so the order refusals come in
depends on where batches end, and a replay split across processes sees other batches.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, Literal, NamedTuple

from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import SchemaError
from lodestream.schemas.trust import event_from_message

log = logging.getLogger(__name__)

MAX_LISTED: Final = 100


class Raw(NamedTuple):
    """One message as the log stored it: its stream sequence, subject and body."""

    seq: int
    subject: str
    data: bytes


Stage = Literal["shared rule", "transition", "unreadable"]


@dataclass(frozen=True, slots=True)
class Refusal:
    """A message the analytics skipped: refused by the shared rule, an illegal transition
    (what the projector quarantines), or a line of a copy that holds no message at all."""

    seq: int
    subject: str
    stage: Stage
    reason: str


@dataclass(slots=True)
class IntakeReport:
    """What was read and what was refused, for the summary's first lines."""

    read: int = 0
    accepted: int = 0
    refused: int = 0  # by the shared rule
    illegal: int = 0  # accepted by the rule, refused by the state machine
    unreadable: int = 0  # lines of a copy that are no message
    listed: list[Refusal] = field(default_factory=list)  # the lowest sequences, in order
    first_seq: int | None = None
    last_seq: int | None = None

    def refuse(self, seq: int, subject: str, stage: Stage, reason: str) -> None:
        if stage == "shared rule":
            self.refused += 1
        elif stage == "transition":
            self.illegal += 1
        else:
            self.unreadable += 1
        listed = self.listed
        if len(listed) >= MAX_LISTED:
            if seq >= listed[-1].seq:
                return
            listed.pop()
        refusal = Refusal(seq, subject, stage, reason)
        # After any of the same sequence (the unreadable lines of a copy share 0): in order read.
        bisect.insort_right(listed, refusal, key=_seq_of)
        log_refusal(refusal)

    @property
    def skipped(self) -> int:
        return self.refused + self.illegal + self.unreadable


def log_refusal(refusal: Refusal) -> None:
    seq, subject, stage, reason = refusal.seq, refusal.subject, refusal.stage, refusal.reason
    log.warning("skipped event %d on %s (%s): %s", seq, subject, stage, reason)


def _seq_of(refusal: Refusal) -> int:
    return refusal.seq


def accept(raws: Iterable[Raw], report: IntakeReport) -> list[tuple[int, Event]]:
    """The events of ``raws`` that the shared rule accepts, with their sequences, in order."""
    accepted: list[tuple[int, Event]] = []
    append = accepted.append
    read = 0
    seq = 0
    for seq, subject, data in raws:
        read += 1
        if report.first_seq is None:
            report.first_seq = seq
        try:
            append((seq, event_from_message(subject, data)))
        except SchemaError as exc:  # Untrusted, and anything of the schemas beneath it
            report.refuse(seq, subject, "shared rule", str(exc))
    if read:
        report.read += read
        report.accepted += len(accepted)
        report.last_seq = seq
    return accepted
