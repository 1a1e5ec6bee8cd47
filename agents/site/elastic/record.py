"""A plan as events: the ``scaler.decided`` that records it, and the batch events it causes. Pure.

The decision is appended first, with its inputs; the ``batch.requested`` and
``batch.deletion_requested`` events follow. Their ids (and the requested batch jobs' ids) are
derived from the decision's id, and their times are the decision's, so the same decision always
causes the very same events: an agent that stopped half-way completes the decision it finds on
the log instead of doubling it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from pydantic import BaseModel

from lodestream.agents.site.elastic.policy import Plan, plan
from lodestream.schemas.envelope import Event
from lodestream.schemas.events import BatchJobDeletionRequested, BatchJobRequested
from lodestream.schemas.events.batch import BatchReasonData
from lodestream.schemas.events.scaler import (
    ScalerBacklog,
    ScalerDecided,
    ScalerDecidedData,
    ScalerLimits,
    ScalerRequest,
    WindowData,
    scaler_id,
)
from lodestream.schemas.ids import derived_id, uuid7


def site_actor(site: str) -> str:
    return f"site:{site}"


def requested_batch_id(decision_id: uuid.UUID, index: int) -> uuid.UUID:
    return derived_id(str(decision_id), "scaler", "batch", str(index))


def decided(
    site: str,
    result: Plan,
    *,
    backlog: ScalerBacklog | None,
    windows: Sequence[WindowData] | None,
    limits: ScalerLimits,
    now: datetime,
    decision_id: uuid.UUID | None = None,
) -> ScalerDecided:
    """The event that records ``result`` and everything it was decided from."""
    decision_id = decision_id or uuid7()
    return ScalerDecided.create(
        site=site,
        aggregate_id=scaler_id(site),
        actor=site_actor(site),
        event_id=decision_id,
        causation_id=backlog.id if backlog is not None else None,
        occurred_at=now,
        data=ScalerDecidedData(
            backlog_id=backlog.id if backlog is not None else None,
            backlog=backlog.data if backlog is not None else None,
            windows=tuple(windows) if windows is not None else None,
            limits=limits,
            queued=result.queued,
            running=result.running,
            requests=tuple(
                ScalerRequest(
                    batch_job_id=requested_batch_id(decision_id, i),
                    request=p.request,
                    window=p.window,
                )
                for i, p in enumerate(result.requests)
            ),
            deletions=result.deletions,
            reason=result.reason,
        ),
    )


def effects(decision: ScalerDecided) -> list[tuple[Event, int | None]]:
    """The batch events ``decision`` causes, each with the sequence its append expects.

    A requested batch job is a new aggregate (expect 0). A deletion request is appended
    whatever its batch job did meanwhile (None): the batch lifecycle (``schemas/batch.py``)
    refuses one for a job that has already ended, which is then a no-op.
    """
    caused: list[tuple[Event, int | None]] = []
    for request in decision.data.requests:
        requested = _caused(BatchJobRequested, decision, request.batch_job_id, request.request)
        caused.append((requested, 0))
    for deletion in decision.data.deletions:
        reason = BatchReasonData(reason=f"elastic queue: {deletion.reason}")
        caused.append((_caused(BatchJobDeletionRequested, decision, deletion.batch_job_id, reason),
                       None))  # fmt: skip
    return caused


def replay(decision: ScalerDecided) -> Plan:
    """The plan the policy makes from what ``decision`` recorded (equal to what it decided)."""
    data = decision.data
    return plan(data.backlog, data.windows, data.limits, decision.occurred_at)


def _caused(
    cls: type[Event], decision: ScalerDecided, batch_job_id: uuid.UUID, data: BaseModel
) -> Event:
    return cls.create(
        site=decision.site,
        aggregate_id=batch_job_id,
        actor=decision.actor,
        data=data,
        event_id=derived_id(str(decision.id), "scaler", cls.model_fields["type"].default,
                            str(batch_job_id)),
        causation_id=decision.id,
        correlation_id=decision.id,
        occurred_at=decision.occurred_at,
    )  # fmt: skip
