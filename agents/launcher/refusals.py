"""Putting a pilot's refusal of a job on record, once per time the job becomes runnable.

A pilot that can never run a job (too few or too small nodes, the other mode) hands it back
to the site's other pilots. Without a word on the log the job would wait, runnable, with
its only reason in the pilot's stderr. So the first pilot to refuse a delivery appends
``job.placement_refused`` chained on it: the event carries the job's work, so it is the
job's runnable event from then on (``launch-<site>`` delivers it), and a pilot that fits
leases the job chained on it. A pilot never appends one on a delivery that is itself a
refusal, and the compare-and-set lets one pilot of many land: a job gets at most one per
time it becomes runnable, whatever the number of pilots that refuse it.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Final

from lodestream.agents.launcher.appends import append_patiently
from lodestream.agents.launcher.work import WorkItem
from lodestream.eventlog import ConflictError, EventLog
from lodestream.schemas.events.job import JobPlacementRefused, LeaseData
from lodestream.schemas.ids import derived_id

log = logging.getLogger(__name__)

NOTE_WITHIN_S: Final = 5.0  # a refusal is a note: it never holds the pilot's offers up long


def placement_refused(
    item: WorkItem, *, session_id: uuid.UUID, actor: str, reason: str
) -> JobPlacementRefused:
    """The refusal of ``item`` by the pilot of ``session_id``, chained on ``item.seq``.

    Its id is the delivery's: every pilot refusing the same delivery mints the same event,
    so a retry or a second pilot is a duplicate, never a second refusal."""
    return JobPlacementRefused.create(
        site=item.site,
        aggregate_id=item.job_id,
        actor=actor,
        data=LeaseData(session_id=session_id, reason=reason, work=item.spec, attempt=item.attempt),
        event_id=derived_id(item.site, str(item.job_id), "placement_refused", str(item.seq)),
    )


async def note_refusal(
    event_log: EventLog, item: WorkItem, *, session_id: uuid.UUID, actor: str, reason: str
) -> bool:
    """Append the refusal; True once the delivery is settled by it (ours or another's landed,
    or the job moved on), False if the log did not answer (hand the delivery back)."""
    event = placement_refused(item, session_id=session_id, actor=actor, reason=reason)
    try:
        seq = await append_patiently(
            event_log, event, item.seq, until=time.monotonic() + NOTE_WITHIN_S, gone=lambda: False
        )
    except ConflictError:
        return True  # another pilot's refusal, a lease or a kill came first
    except Exception as exc:  # a note must never stop the pilot
        log.warning("launcher: refusal of job %s not recorded: %s", item.job_id, exc)
        return False
    return seq is not None
