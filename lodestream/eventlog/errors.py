"""Errors of the event log.

EventLogError
├── ConflictError        compare-and-set lost: the aggregate moved on (JetStream 10071)
├── StreamConfigError    a stream exists with settings that cannot be updated in place
├── AppendError          any other refusal or timeout from JetStream
├── NotTaken             a decision's append was not taken: decide the delivery again (Retryable)
└── ReadError            a delivery to a reader that is no message of a stream (Retryable)

Retryable                "not now" from our own code: see lodestream.eventlog.transient
"""

from __future__ import annotations


class EventLogError(Exception):
    """Base of event-log errors."""


class Retryable(Exception):
    """Raised by our own code for "not now": something this process reads is behind (the
    read model has not reached a sequence) or away. The base of such errors, so that
    :func:`~lodestream.eventlog.transient.transient` knows them without knowing every
    module."""


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


class NotTaken(EventLogError, Retryable):
    """JetStream did not take an append a decision made (its refusal is the cause): the
    delivery stays unsettled and is decided again, which yields the same append."""


class ReadError(EventLogError, Retryable):
    """A pull consumer's inbox received something that is no message of its stream."""
