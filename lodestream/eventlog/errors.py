"""Errors of the event log.

EventLogError
├── ConflictError        compare-and-set lost: the aggregate moved on (JetStream 10071)
├── StreamConfigError    a stream exists with settings that cannot be updated in place
├── AppendError          any other refusal or timeout from JetStream
└── ReadError            a delivery to a reader that is no message of a stream
"""

from __future__ import annotations


class EventLogError(Exception):
    """Base of event-log errors."""


class ConflictError(EventLogError):
    """The aggregate's last sequence was not the one the writer acted on."""

    def __init__(self, subject: str, expected: int, actual: int | None, description: str) -> None:
        super().__init__(
            f"conflict on {subject}: expected last sequence {expected}, "
            f"stream has {actual if actual is not None else 'another'} ({description})"
        )
        self.subject = subject
        self.expected = expected
        self.actual = actual


class StreamConfigError(EventLogError):
    """A stream could not be created or brought to the wanted configuration."""


class AppendError(EventLogError):
    """JetStream refused or did not acknowledge an append."""


class ReadError(EventLogError):
    """A pull consumer's inbox received something that is no message of its stream."""
