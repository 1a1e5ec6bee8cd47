"""Which failed appends may succeed if tried again: one answer for every writer.

A pilot retries its results with it, and the leaf site's forwarder holds an event with it
until the hub answers. Retrying is safe because an event keeps its id (``Nats-Msg-Id``):
an append that had landed while its acknowledgement was lost comes back as a duplicate,
or is recognised by :class:`~lodestream.eventlog.EventLog` as already appended.
"""

from __future__ import annotations

from typing import Final

import nats.errors
from nats.js.errors import APIError, ServiceUnavailableError

from lodestream.eventlog.errors import AppendError, ConflictError

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


def transient(exc: Exception) -> bool:
    """Whether the same append may succeed later: NATS did not answer, JetStream was
    briefly unavailable, or an earlier try of it is still in flight. A refusal (a conflict,
    a bad subject, no stream) stays a refusal."""
    if isinstance(exc, ConflictError):
        return False
    if isinstance(exc, AppendError):
        cause = exc.__cause__
        if not isinstance(cause, APIError):
            return True
        return isinstance(cause, ServiceUnavailableError) or cause.err_code in _IN_PROCESS
    return isinstance(exc, nats.errors.Error | OSError | TimeoutError)
