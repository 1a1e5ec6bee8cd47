"""The elastic queue's policy: which pilot batch jobs to request and which to delete. Pure.

:func:`plan` is a function of what a ``scaler.decided`` event records — the backlog, the
backfill windows (when asked for), the limits and the clock — and of nothing else, so a
decision on the log can be replayed and checked.

* **Deficit.** The backlog needs ``ceil(node_footprint)`` nodes at once. Every open batch job
  of the site (requested, submitted, queued or running; the user's own included) covers its
  nodes. The deficit is the difference; none, nothing is requested.
* **Requests.** Each asks for ``deficit`` nodes, raised to ``min_nodes`` and capped at
  ``max_nodes``, until the deficit is covered or ``max_queued_jobs`` batch jobs wait in the
  queue. Wall time: the longest job's, plus the pad, within ``[min, max]_wall_time_min``.
* **Backfill.** With ``use_backfill``, one request per decision, fitted into the best window
  of the configured queue: at most the window's nodes, at most its minutes less the pad.
  A window too small for ``min_nodes`` and ``min_wall_time_min`` is not used; if none fits,
  nothing is requested (the windows of the next period may). Windows of one queue overlap
  (they are cumulative), so fitting more than one job would count free nodes twice.
* **Deletions.** A batch job the elastic queue requested that is still waiting (requested,
  submitted or queued) for longer than ``max_queue_wait_min`` is deleted; what it covered no
  longer counts, so a better-fitting replacement may be requested in the same decision. A
  user's batch jobs are never deleted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from lodestream.schemas.events.batch import BatchRequestData
from lodestream.schemas.events.scaler import (
    ScalerBacklogData,
    ScalerBatchJob,
    ScalerDeletion,
    ScalerLimits,
    WindowData,
)

WAITING: Final = frozenset({"requested", "submitted", "queued"})
_EPSILON: Final = 1e-6  # 2.0000001 nodes of footprint (float sums) is 2 nodes, not 3
_UNLIMITED: Final = 2**63  # a window with no known end is longer than any other


@dataclass(frozen=True, slots=True)
class Planned:
    """A batch job to request, and the backfill window it was fitted to (None: not asked)."""

    request: BatchRequestData
    window: WindowData | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do, and why. ``queued``/``running`` count the batch jobs the backlog listed."""

    requests: tuple[Planned, ...]
    deletions: tuple[ScalerDeletion, ...]
    reason: str
    queued: int = 0
    running: int = 0

    @property
    def acts(self) -> bool:
        return bool(self.requests or self.deletions)


def plan(
    backlog: ScalerBacklogData | None,
    windows: Sequence[WindowData] | None,
    limits: ScalerLimits,
    now: datetime,
) -> Plan:
    """Decide on ``backlog`` at ``now``; ``windows`` are required when ``limits.use_backfill``."""
    if backlog is None:
        return Plan((), (), "no backlog from the control plane yet")
    jobs = backlog.batch_jobs
    queued = sum(1 for job in jobs if job.state in WAITING)
    deletions = stale(jobs, limits, now)
    deleted = {d.batch_job_id for d in deletions}
    kept = [job for job in jobs if job.id not in deleted]
    requests, why = _requests(backlog, kept, windows, limits)
    reasons = [why]
    if deletions:
        wait = limits.max_queue_wait_min
        reasons.insert(0, f"deleting {len(deletions)} batch job(s) waiting over {wait} min")
    return Plan(tuple(requests), deletions, "; ".join(reasons), queued, len(jobs) - queued)


def stale(
    jobs: Sequence[ScalerBatchJob], limits: ScalerLimits, now: datetime
) -> tuple[ScalerDeletion, ...]:
    """The elastic queue's batch jobs that have waited longer than ``max_queue_wait_min``."""
    if limits.max_queue_wait_min is None:
        return ()
    limit = timedelta(minutes=limits.max_queue_wait_min)
    return tuple(
        ScalerDeletion(
            batch_job_id=job.id,
            reason=f"{job.state} for {(now - job.requested_at).total_seconds() / 60:.0f} min, "
            f"over max_queue_wait_min ({limits.max_queue_wait_min})",
        )
        for job in jobs
        if job.elastic and job.state in WAITING and now - job.requested_at > limit
    )


def deficit(backlog: ScalerBacklogData, jobs: Sequence[ScalerBatchJob]) -> int:
    """Nodes the backlog needs beyond what ``jobs`` cover (negative: more than covered)."""
    needed = math.ceil(backlog.node_footprint - _EPSILON) if backlog.runnable_jobs else 0
    return needed - sum(job.num_nodes for job in jobs)


def wall_time_min(backlog: ScalerBacklogData, limits: ScalerLimits) -> int:
    """The longest job's wall time plus the pad, within the limits (the minimum if unknown)."""
    wanted = backlog.max_wall_time_min + limits.wall_time_pad_min
    return min(max(wanted, limits.min_wall_time_min), limits.max_wall_time_min)


def _requests(
    backlog: ScalerBacklogData,
    jobs: Sequence[ScalerBatchJob],
    windows: Sequence[WindowData] | None,
    limits: ScalerLimits,
) -> tuple[list[Planned], str]:
    if not backlog.runnable_jobs:
        return [], "nothing runnable"
    missing = deficit(backlog, jobs)
    covered = sum(job.num_nodes for job in jobs)
    if missing <= 0:
        return [], (
            f"backlog of {backlog.node_footprint:g} node(s) covered by {covered} node(s) "
            "requested, queued or running"
        )
    waiting = sum(1 for job in jobs if job.state in WAITING)
    slots = limits.max_queued_jobs - waiting
    if slots <= 0:
        return [], f"{waiting} batch job(s) waiting: max_queued_jobs is {limits.max_queued_jobs}"
    wall = wall_time_min(backlog, limits)
    if limits.use_backfill:
        fitted = fit(windows or (), limits, missing, wall)
        if fitted is None:
            return [], (
                f"no backfill window of queue {limits.queue!r} holds {limits.min_nodes} node(s) "
                f"for {limits.min_wall_time_min} + {limits.wall_time_pad_min} min"
            )
        return [fitted], (
            f"{missing} node(s) short: requesting {fitted.request.num_nodes} node(s) for "
            f"{fitted.request.wall_time_min} min in a backfill window"
        )
    planned: list[Planned] = []
    left = missing
    while left > 0 and len(planned) < slots:
        nodes = min(max(left, limits.min_nodes), limits.max_nodes)
        planned.append(Planned(_request(limits, nodes, wall)))
        left -= nodes
    return planned, (
        f"{missing} node(s) short: requesting {len(planned)} batch job(s) of "
        f"{'/'.join(str(p.request.num_nodes) for p in planned)} node(s) for {wall} min"
    )


def fit(
    windows: Sequence[WindowData], limits: ScalerLimits, missing: int, wall: int
) -> Planned | None:
    """The request that takes the most of ``missing`` nodes (then the longest) in one window."""
    best: tuple[tuple[int, int, int, int], Planned] | None = None
    for window in windows:
        if window.queue != limits.queue or window.nodes < limits.min_nodes:
            continue
        usable = None if window.minutes is None else window.minutes - limits.wall_time_pad_min
        if usable is not None and usable < limits.min_wall_time_min:
            continue
        nodes = min(max(missing, limits.min_nodes), limits.max_nodes, window.nodes)
        minutes = wall if usable is None else min(wall, usable)
        # Ties go to the smaller, then the shorter window: the same choice in any order.
        length = _UNLIMITED if window.minutes is None else window.minutes
        key = (nodes, minutes, -window.nodes, -length)
        if best is None or key > best[0]:
            best = (key, Planned(_request(limits, nodes, minutes), window))
    return best[1] if best is not None else None


def _request(limits: ScalerLimits, nodes: int, wall: int) -> BatchRequestData:
    return BatchRequestData(
        num_nodes=nodes,
        wall_time_min=wall,
        queue=limits.queue,
        project=limits.project,
        job_mode=limits.job_mode,
    )
