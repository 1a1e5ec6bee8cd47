"""Errors of the event-replay analytics: what a source, a selection or a figure can lack.

::

    AnalyticsError           base; a LodeClientError, so the CLI reports it like any other
    ├── SourceError          the log cannot be read: no such file, not an export, no NATS
    ├── OutputError          a report or a copy of the log cannot be written where asked
    ├── NothingSelected      the range or the filters select no job and no pilot
    └── NotEnoughData        a figure needs what the selection does not hold (a finished job)

Events the shared rule refuses are none of these: they are counted, listed and skipped
(:class:`~lodestream.client.analytics.intake.IntakeReport`), never raised.
"""

from __future__ import annotations

from lodestream.client.errors import LodeClientError


class AnalyticsError(LodeClientError):
    """Base of the analytics errors; the message says what to change."""


class SourceError(AnalyticsError):
    """The events cannot be read from where they were asked from."""


class OutputError(AnalyticsError):
    """What was asked for cannot be written (a directory that cannot be made, a full disk)."""


class NothingSelected(AnalyticsError):
    """The log was read, but no job or pilot falls in the range and filters given."""


class NotEnoughData(AnalyticsError):
    """A figure cannot be computed from the selection (e.g. no job finished)."""
