"""Errors of the projector.

ProjectorError
├── Quarantined       one message cannot be folded; it is recorded with the reason and skipped
├── RebuildError      a rebuild could not complete; the live tables are untouched
└── ProjectorBehind   (also a TimeoutError) a wait for the projector to reach a sequence ran out
"""

from __future__ import annotations


class ProjectorError(Exception):
    """Base of projector errors."""


class RebuildError(ProjectorError):
    """A rebuild failed before its swap; nothing visible changed."""


class ProjectorBehind(ProjectorError, TimeoutError):
    """The projector had not applied ``seq`` when the wait ran out; it was at ``position``."""

    def __init__(self, seq: int, position: int, timeout_s: float) -> None:
        super().__init__(f"projector at {position}, not {seq}, after {timeout_s:g} s")
        self.seq = seq
        self.position = position
        self.timeout_s = timeout_s
