"""What the controller tells an elastic queue: its site's backlog, as a ``scaler.backlog``. Pure.

Sites cannot read Postgres, so the controller, which can, reads each elastic site's runnable
backlog and open batch jobs (``reads.py``) and hands them over as an event on the site's own
scaler subject, where the site's key may direct-get it. :func:`snapshot` turns the rows into
the event's data and :func:`due` says whether it is worth an event; the loop is in
``backlog.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from pydantic import ValidationError

from lodestream.schemas.events.scaler import (
    MAX_BACKLOG_BATCH_JOBS,
    ScalerBacklog,
    ScalerBacklogData,
    ScalerBatchJob,
    scaler_id,
)
from lodestream.schemas.ids import derived_id

ACTOR: Final = "controller:main"
OPEN_BATCH_STATES: Final = ("requested", "submitted", "queued", "running")
"""Batch jobs that hold or may soon hold nodes; a deletion requested no longer counts."""


@dataclass(frozen=True, slots=True)
class BacklogRow:
    """The runnable, unleased jobs of one site, aggregated."""

    jobs: int
    node_footprint: float
    node_minutes: float
    max_wall_time_min: int


@dataclass(frozen=True, slots=True)
class BatchRow:
    id: uuid.UUID
    state: str
    num_nodes: int
    wall_time_min: int
    queue: str
    created_at: datetime
    requested_by: str


def snapshot(
    site: str, as_of_seq: int, backlog: BacklogRow | None, batch: Sequence[BatchRow]
) -> ScalerBacklogData:
    """The backlog event's data; ``batch`` newest first (only the newest are listed)."""
    backlog = backlog or BacklogRow(0, 0.0, 0.0, 0)
    return ScalerBacklogData(
        as_of_seq=as_of_seq,
        runnable_jobs=backlog.jobs,
        # Rounded, so that summing the same rows in another order is no change.
        node_footprint=round(backlog.node_footprint, 6),
        node_minutes=round(backlog.node_minutes, 3),
        max_wall_time_min=backlog.max_wall_time_min,
        batch_jobs=tuple(
            ScalerBatchJob(
                id=row.id, state=row.state, num_nodes=row.num_nodes,
                wall_time_min=row.wall_time_min, queue=row.queue,
                requested_at=row.created_at, elastic=row.requested_by == f"site:{site}",
            )
            for row in batch[:MAX_BACKLOG_BATCH_JOBS]
        ),
    )  # fmt: skip


def due(data: ScalerBacklogData, previous: ScalerBacklogData | None, newest_batch_seq: int) -> bool:
    """Worth an event: what the site decides on changed since it last got a backlog, or the
    projector has passed the site's newest batch event since (``newest_batch_seq``).

    The second is for the elastic queue, which decides again only on a backlog that has seen
    the batch events of its last decision. Most of those change the backlog anyway; one that
    changes nothing (a deletion requested as the job ended, refused by the fold) must not
    leave it waiting.
    """
    if not data.same_as(previous):
        return True
    assert previous is not None  # same_as(None) is False
    return previous.as_of_seq < newest_batch_seq <= data.as_of_seq


def stored_backlog(value: Any) -> ScalerBacklogData | None:
    """The backlog the read model holds for a site (jsonb), or None if none or unreadable."""
    if value is None:
        return None
    try:
        return ScalerBacklogData.model_validate(value)
    except ValidationError:
        return None  # written by an older version: publishing a fresh one is harmless


def backlog_event(site: str, data: ScalerBacklogData) -> ScalerBacklog:
    """The event, with an id derived from what it says: two controllers saying the same thing
    at the same position append it once."""
    return ScalerBacklog.create(
        site=site,
        aggregate_id=scaler_id(site),
        actor=ACTOR,
        data=data,
        event_id=derived_id("controller", "scaler.backlog", site, data.model_dump_json()),
    )
