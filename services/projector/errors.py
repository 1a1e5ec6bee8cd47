"""Errors of the projector.

ProjectorError
├── Quarantined       one message cannot be folded; it is recorded with the reason and skipped
└── RebuildError      a rebuild could not complete; the live tables are untouched
"""

from __future__ import annotations


class ProjectorError(Exception):
    """Base of projector errors."""


class RebuildError(ProjectorError):
    """A rebuild failed before its swap; nothing visible changed."""
