"""Errors of the schemas: what an event, a subject or a step of the state machine can get wrong.

::

    SchemaError              base; a ValueError, so pydantic validators report them as input errors
    ├── SubjectError         a subject or subject token (site name, type) off the grammar
    ├── UpcastError          no chain of upcasters from a document's version to the current one
    ├── DecodeError          bytes that are not a valid event of a known type and version
    ├── IllegalTransition    an event the state machine does not allow from the job's state
    └── Untrusted            a message the shared rule refuses (:mod:`~lodestream.schemas.trust`);
                             quarantine or skip it, never act on it

Every consumer keeps going past these: what they describe is one bad message, not a
broken service (the projector quarantines it, the others log, count and skip it).
"""

from __future__ import annotations


class SchemaError(ValueError):
    """Base of the errors raised by ``lodestream.schemas``."""


class SubjectError(SchemaError):
    """A subject or subject token that does not follow the grammar."""


class UpcastError(SchemaError):
    """No path from the document's version to the current one."""


class DecodeError(SchemaError):
    """Bytes that are not a valid event of a known type and version."""


class IllegalTransition(SchemaError):
    """An event that the state machine does not allow from the job's current state."""


class Untrusted(SchemaError):
    """A message that the rule refuses; the message says why. Quarantine or skip it."""


def first_line(exc: BaseException) -> str:
    """The first line of an error's message, for a log line or a recorded reason; the
    error's class name when its message is empty."""
    return (str(exc).splitlines() or [type(exc).__name__])[0]
