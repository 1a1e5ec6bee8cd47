"""Which failures may pass if the same work is tried again: one answer for every consumer.

Every process that consumes or appends to the log asks this one question (the pilot of its
results, the controller and the site's modules of a delivery, the leaf site's forwarder of
an event it holds, every pull loop of a failed fetch). Trying again is safe because an
event keeps its id (``Nats-Msg-Id``) and a compare-and-set its expected sequence: an append
that had landed while its acknowledgement was lost comes back as a duplicate, or is
recognised by :class:`~lodestream.eventlog.EventLog` as already appended.
"""

from __future__ import annotations

import sys
from typing import Final

import nats.errors
from nats.js.errors import APIError, ServiceUnavailableError

from lodestream.eventlog.errors import AppendError, ConflictError, Retryable

# A clustered stream answers a retry whose first try is still being replicated with
# "duplicate message id is in process" (409): the first try may yet land, so this is no
# refusal. Taken for one, a lease that did land was dropped, and its job stayed RUNNING
# under a live session that would never run it (found with a partitioned node).
DUPLICATE_IN_PROCESS: Final = 10158
# The same for a compare-and-set: a clustered stream answers "wrong last sequence" without a
# sequence (10164) while an earlier append to the aggregate, maybe this one's first try, is
# still being replicated; it checks nothing then. The next try is checked for real: it lands,
# or is recognised as landed, or conflicts with the sequence (found with a partitioned node).
SUBJECT_IN_PROCESS: Final = 10164

_IN_PROCESS: Final = frozenset({DUPLICATE_IN_PROCESS, SUBJECT_IN_PROCESS})


def transient(exc: BaseException) -> bool:
    """Whether the same work may succeed later: NATS or Postgres did not answer or went
    away, JetStream was briefly unavailable, an earlier try of an append is still in
    flight, or our own :class:`Retryable` says "not now". A refusal (a lost
    compare-and-set, a bad subject, no stream, a programming error) stays a refusal."""
    if isinstance(exc, ConflictError):
        return False
    if isinstance(exc, AppendError):
        cause = exc.__cause__
        if not isinstance(cause, APIError):
            return True
        return isinstance(cause, ServiceUnavailableError) or cause.err_code in _IN_PROCESS
    if isinstance(exc, Retryable | nats.errors.Error | OSError | TimeoutError):
        return True
    return _database_away(exc)


def _database_away(exc: BaseException) -> bool:
    """Postgres closed the connection or did not answer (not: it refused the statement).

    Looked up in ``sys.modules``: a process that never imported psycopg (a pilot) cannot
    meet its errors, and need not pay for importing it here.
    """
    psycopg = sys.modules.get("psycopg")
    if psycopg is None:
        return False
    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
