"""Appends a pilot must not lose to a NATS outage: retried until they land or are refused.

Retrying is safe because the event keeps its id (``Nats-Msg-Id``): an append that had
landed while its acknowledgement was lost comes back as a duplicate, or is recognised
by :class:`EventLog` as already appended; an append chained on a lease that the
controller expired in the meantime is refused (:class:`ConflictError`), which is how a
pilot learns it was fenced.
"""

from __future__ import annotations

from collections.abc import Callable

import nats.errors
from nats.js.errors import APIError, ServiceUnavailableError

from lodestream.agents.site.retry import Backoff, retry_until
from lodestream.eventlog import AppendError, ConflictError, EventLog
from lodestream.schemas.envelope import Event

RETRY = Backoff(first_s=0.25, cap_s=5.0)


def transient(exc: Exception) -> bool:
    """Whether the same append may succeed later: NATS did not answer, or JetStream was
    briefly unavailable. A refusal (a conflict, a bad subject, no stream) stays a refusal."""
    if isinstance(exc, ConflictError):
        return False
    if isinstance(exc, AppendError):
        cause = exc.__cause__
        return not isinstance(cause, APIError) or isinstance(cause, ServiceUnavailableError)
    return isinstance(exc, nats.errors.Error | OSError | TimeoutError)


async def append_patiently(
    log: EventLog, event: Event, expect: int, *, until: float, gone: Callable[[], bool]
) -> int | None:
    """Append ``event`` chained on ``expect`` and return its sequence.

    None if NATS did not answer before ``until`` (``time.monotonic()``). Raises
    :class:`ConflictError` if the aggregate moved on, and the last error once ``gone()``
    says retrying is pointless (the session was lost).
    """
    appended = await retry_until(
        f"append {event.type} of {event.aggregate_id}",
        lambda: log.append(event, expect=expect),
        retryable=lambda exc: transient(exc) and not gone(),
        deadline=until,
        backoff=RETRY,
    )
    return None if appended is None else appended.seq
