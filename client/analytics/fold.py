"""The replay fold: accepted events in, :class:`Timelines` out. Pure: no I/O, no clock.

Each job event is judged with :func:`lodestream.schemas.fold.apply`, the one place a job
event is judged legal, before it extends the job's timeline; an illegal one (what the
projector quarantines) is skipped and reported like a refusal. Batch events are judged by
:func:`~lodestream.schemas.batch.next_batch_state`. Events of jobs and pilots outside the
selection, and events whose job or pilot began before the range read, are counted apart.

::

    timelines = fold_timelines([(seq, event), ...], Selection.of(sites=["alpha"]))
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from lodestream.client.analytics.intake import IntakeReport
from lodestream.client.analytics.pilots import (
    BatchInterval,
    SessionInterval,
    end_session,
    extend_batch,
    open_session,
    request_batch,
)
from lodestream.client.analytics.selection import Selection
from lodestream.client.analytics.timeline import JobTimeline, extend, start_timeline
from lodestream.schemas.batch import next_batch_state
from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import IllegalTransition
from lodestream.schemas.events.batch import BatchJobRequested
from lodestream.schemas.events.job import JobCreated
from lodestream.schemas.events.session import SessionOpened
from lodestream.schemas.fold import JobView, apply


@dataclass(slots=True)
class FoldCounts:
    """Events the fold did not turn into figures, by why."""

    folded: int = 0  # events that extended a selected job's or pilot's record
    not_selected: int = 0  # of jobs or pilots the filters leave out
    begun_before: int = 0  # of jobs or pilots whose first event is not in what was read
    other: int = 0  # of kinds the figures do not use (apps, sites, transfers, scaler)
    begun_before_jobs: set[uuid.UUID] = field(default_factory=set)


@dataclass(slots=True)
class Timelines:
    """Every selected job's timeline and every selected pilot's intervals."""

    jobs: dict[uuid.UUID, JobTimeline] = field(default_factory=dict)
    sessions: dict[uuid.UUID, SessionInterval] = field(default_factory=dict)
    batches: dict[uuid.UUID, BatchInterval] = field(default_factory=dict)
    first_at: float | None = None  # the earliest and latest time of a folded event
    last_at: float | None = None
    counts: FoldCounts = field(default_factory=FoldCounts)

    @property
    def empty(self) -> bool:
        return not (self.jobs or self.sessions or self.batches)


class TimelineFold:
    """Fold events one by one with :meth:`apply`; read :attr:`timelines` at any point.

    ``report`` receives the illegal transitions (what the projector would quarantine).
    """

    def __init__(
        self, selection: Selection | None = None, report: IntakeReport | None = None
    ) -> None:
        self.selection = selection or Selection()
        self.report = report or IntakeReport()
        self.timelines = Timelines()
        # Keyed by the UUID's int: an int hashes and compares in C, a UUID in Python code,
        # and these are looked up for every job event. timelines.jobs holds the same timelines.
        self._views: dict[int, JobView] = {}
        self._timelines: dict[int, JobTimeline] = {}
        self._left_out: set[uuid.UUID] = set()

    def apply(self, seq: int, event: Event) -> None:
        kind = event.kind
        at = event.occurred_at.timestamp()
        if kind == "job":
            folded = self._job(seq, event, at)
        elif kind == "session":
            folded = self._session(seq, event, at)
        elif kind == "batch":
            folded = self._batch(seq, event, at)
        else:
            self.timelines.counts.other += 1
            return
        if folded:
            self._count(at)

    def _count(self, at: float) -> None:
        timelines = self.timelines
        timelines.counts.folded += 1
        if timelines.first_at is None or at < timelines.first_at:
            timelines.first_at = at
        if timelines.last_at is None or at > timelines.last_at:
            timelines.last_at = at

    def _job(self, seq: int, event: Event, at: float) -> bool:
        job_id = event.aggregate_id
        key = job_id.int
        view = self._views.get(key)
        if view is None and not self._known_new(job_id, event):
            return False
        try:
            self._views[key] = apply(view, event, seq)
        except IllegalTransition as exc:
            self.report.refuse(seq, event.subject, "transition", str(exc))
            return False
        if isinstance(event, JobCreated):
            timeline = start_timeline(seq, event, at)
            self._timelines[key] = self.timelines.jobs[job_id] = timeline
        else:
            extend(self._timelines[key], seq, event, at)
        return True

    def _known_new(self, job_id: uuid.UUID, event: Event) -> bool:
        """For an event of a job not seen yet: True if it creates a selected job."""
        counts = self.timelines.counts
        if job_id in self._left_out:
            counts.not_selected += 1
            return False
        if not isinstance(event, JobCreated):
            # Created before what was read (or never: then a later reader from sequence 1
            # would see it quarantined); either way nothing to fold it into.
            counts.begun_before += 1
            counts.begun_before_jobs.add(job_id)
            return False
        if not self.selection.admits_job(event):
            self._left_out.add(job_id)
            counts.not_selected += 1
            return False
        return True

    def _session(self, seq: int, event: Event, at: float) -> bool:
        sessions = self.timelines.sessions
        if isinstance(event, SessionOpened):
            if event.aggregate_id in sessions:
                return False  # opened twice: the first counts
            if not self.selection.admits_opening(event.site, at):
                self._left_out.add(event.aggregate_id)
                self.timelines.counts.not_selected += 1
                return False
            sessions[event.aggregate_id] = open_session(seq, event)
            return True
        session = sessions.get(event.aggregate_id)
        if session is None:
            self._unknown_pilot(event.aggregate_id)
            return False
        end_session(session, event)
        return True

    def _batch(self, seq: int, event: Event, at: float) -> bool:
        batch_id = event.aggregate_id
        batches = self.timelines.batches
        if batch_id in self._left_out:
            self.timelines.counts.not_selected += 1
            return False
        known = batches.get(batch_id)
        if known is None and not isinstance(event, BatchJobRequested):
            self._unknown_pilot(batch_id)
            return False
        try:
            state = next_batch_state(known.state if known else None, event.type)
        except IllegalTransition as exc:
            self.report.refuse(seq, event.subject, "transition", str(exc))
            return False
        if isinstance(event, BatchJobRequested):
            if not self.selection.admits_opening(event.site, at):
                self._left_out.add(batch_id)
                self.timelines.counts.not_selected += 1
                return False
            batches[batch_id] = request_batch(seq, event)
        elif known is not None:
            extend_batch(known, event, state)
        return True

    def _unknown_pilot(self, aggregate_id: uuid.UUID) -> None:
        counts = self.timelines.counts
        if aggregate_id in self._left_out:
            counts.not_selected += 1
        else:
            counts.begun_before += 1


def fold_timelines(
    events: Iterable[tuple[int, Event]], selection: Selection | None = None
) -> Timelines:
    """The timelines of ``(sequence, event)`` pairs in log order, under ``selection``."""
    fold = TimelineFold(selection)
    for seq, event in events:
        fold.apply(seq, event)
    return fold.timelines
