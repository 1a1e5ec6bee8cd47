"""Appends a pilot must not lose to a NATS outage: retried until they land or are refused.

Retrying is safe because the event keeps its id (``Nats-Msg-Id``): an append that had
landed while its acknowledgement was lost comes back as a duplicate, or is recognised
by :class:`EventLog` as already appended; an append chained on a lease that the
controller expired in the meantime is refused (:class:`ConflictError`), which is how a
pilot learns it was fenced.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final, Literal

from lodestream.agents.site.retry import Backoff, retry_until
from lodestream.eventlog import AppendError, ConflictError, EventLog
from lodestream.eventlog.outbox import Outbox
from lodestream.eventlog.transient import transient
from lodestream.schemas.envelope import Event

log = logging.getLogger(__name__)

RETRY = Backoff(first_s=0.25, cap_s=5.0)
# At a leaf-node site: how long the hub may stay silent on a result before the pilot keeps
# it at the site instead (a few tries; the leaf answers at once, the hub over the WAN).
KEEP_AFTER_S: Final = 2.0
KEPT: Final = "kept"


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


async def append_or_keep(
    log_: EventLog,
    outbox: Outbox | None,
    event: Event,
    expect: int,
    *,
    until: float,
    gone: Callable[[], bool],
) -> int | Literal["kept"] | None:
    """:func:`append_patiently`, but at a leaf-node site (``outbox``) an append the hub does
    not answer within :data:`KEEP_AFTER_S` is kept in the leaf's ``OUTBOX`` instead, for
    the site agent to forward when the link is back (``agents/site/forward.py``).

    Returns the hub's sequence, :data:`KEPT`, or None (neither answered before ``until``).
    Keeping is safe whatever became of the direct tries: the forwarder's append carries the
    same event id and compare-and-set, so one that had landed is recognised, and one the
    hub would refuse is refused then.
    """
    if outbox is None:
        return await append_patiently(log_, event, expect, until=until, gone=gone)
    try:
        seq = await append_patiently(
            log_, event, expect, until=min(until, time.monotonic() + KEEP_AFTER_S), gone=gone
        )
    except ConflictError:
        raise
    except Exception as exc:
        if not transient(exc):
            raise
        seq = None
    if seq is not None:
        return seq
    try:
        await outbox.keep(event, expect)
    except AppendError as exc:  # the leaf is the site's own server: should not happen
        log.warning("launcher: neither the hub nor the leaf took %s: %s", event.subject, exc)
        return await append_patiently(log_, event, expect, until=until, gone=gone)
    log.warning("launcher: the hub did not answer; %s kept at the site", event.subject)
    return KEPT
