"""One job's history as the analytics read it: :class:`JobTimeline`, and how an event extends it.

A timeline records, in log order, every state the job entered and when (a step recorded as
skipped inside a later event is entered at that event's time, with that event's sequence:
zero time, and recognisably skipped), each attempt's run (from ``job.started`` to the event
that reported its end), and each failure with its cause chain. Times are POSIX seconds of
the producers' clocks (``occurred_at``).

Plain slotted dataclasses and tuples, no pydantic: a replay folds a million events, and the
figures read these many times. :func:`extend` trusts that the event is legal for the job
(the caller has checked it with :func:`lodestream.schemas.fold.apply`); it does no I/O.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, NamedTuple

from pydantic import BaseModel

from lodestream.client.analytics.pilot_times import NO_STAMPS, PilotStamps, merge, stamps_of
from lodestream.schemas.envelope import Event
from lodestream.schemas.events.job import (
    FailureData,
    FinishedData,
    JobCreated,
    RunResultData,
    StartedData,
)
from lodestream.schemas.states import FINAL, TRANSITIONS, JobState

RunOutcome = Literal["done", "errored", "timed_out", "killed"]
_RESULTS: Final[dict[str, RunOutcome]] = {
    "job.run_done": "done",
    "job.run_errored": "errored",
    "job.run_timed_out": "timed_out",
}
FAILURE_EVENTS: Final = frozenset({"job.failed", "job.run_errored", "job.run_timed_out"})


class StateEntry(NamedTuple):
    """The job entered ``state`` at ``at`` through the event at ``seq``, in ``attempt``."""

    state: JobState
    at: float
    seq: int
    attempt: int


@dataclass(slots=True)
class RunRecord:
    """One attempt's run, from its ``job.started`` to the event that reported its end.

    ``leased_at``, ``spawned_at``, ``exited_at`` and ``pid`` are the pilot's own stamps
    (:mod:`~lodestream.client.analytics.pilot_times`); ``lease_event_at`` is the time of a
    separate ``job.leased`` event, if the pilot took the lease before starting. ``ended_at``
    is None while the run goes on (as far as the log read shows).
    """

    attempt: int
    session_id: uuid.UUID | None
    started_at: float
    started_seq: int
    lease_event_at: float | None = None
    stamps: PilotStamps = NO_STAMPS
    ended_at: float | None = None
    outcome: RunOutcome | None = None
    reported_by_pilot: bool = False
    return_code: int | None = None
    runtime_s: float | None = None
    slots: tuple[str, ...] = ()  # "host:core" of each core the pilot placed it on, if recorded


@dataclass(frozen=True, slots=True)
class FailureRecord:
    """A failure event of the job: a failed run, a timed-out run, or the job failing."""

    seq: int
    at: float
    type: str
    attempt: int
    reason: str
    cause: tuple[str, ...]
    return_code: int | None
    stderr_tail: str  # the last line of the run's stderr tail
    stderr_first: str = ""  # its first line: usually the error, before any traceback


@dataclass(slots=True)
class JobTimeline:
    """Everything the log says of one job, as plain values (see the module docstring)."""

    job_id: uuid.UUID
    site: str
    app: str
    tags: Mapping[str, str]
    num_nodes: int
    ranks: int  # num_nodes x ranks_per_node
    node_packing_count: int
    wall_time_min: int
    created_at: float
    created_seq: int
    state: JobState = JobState.CREATED
    attempt: int = 1  # the attempt the job's events are in now (the system's own numbering)
    entries: list[StateEntry] = field(default_factory=list)
    runs: list[RunRecord] = field(default_factory=list)
    failures: list[FailureRecord] = field(default_factory=list)
    pending_lease_at: float | None = None  # a job.leased not yet followed by job.started

    @property
    def nodes(self) -> float:
        """The nodes the job occupies while it runs (a packed job shares its node)."""
        return self.num_nodes / self.node_packing_count

    @property
    def attempts(self) -> int:
        """Runs started (``job.started`` events)."""
        return len(self.runs)

    def last(self, state: JobState) -> StateEntry | None:
        """The job's latest entry into ``state``, if it ever entered it."""
        for entry in reversed(self.entries):
            if entry.state is state:
                return entry
        return None

    def last_of(self, states: frozenset[JobState], before_seq: int) -> StateEntry | None:
        """The latest entry into one of ``states`` made by an event before ``before_seq``."""
        for entry in reversed(self.entries):
            if entry.seq < before_seq and entry.state in states:
                return entry
        return None

    @property
    def final_at(self) -> float | None:
        """When the job reached the final state it is in now (None: not final)."""
        if self.state not in FINAL:
            return None
        entries = self.entries
        if entries and entries[-1].state is self.state:  # nearly always: asked of every job
            return entries[-1].at
        entry = self.last(self.state)
        return entry.at if entry is not None else None


def start_timeline(seq: int, event: JobCreated, at: float) -> JobTimeline:
    """The timeline of the job ``event`` creates (at time ``at``)."""
    spec = event.data
    timeline = JobTimeline(
        job_id=event.aggregate_id,
        site=event.site,
        app=spec.app,
        tags=dict(spec.tags),
        num_nodes=spec.num_nodes,
        ranks=spec.num_nodes * spec.ranks_per_node,
        node_packing_count=spec.node_packing_count,
        wall_time_min=spec.wall_time_min,
        created_at=at,
        created_seq=seq,
    )
    timeline.entries.append(StateEntry(JobState.CREATED, at, seq, 1))
    # A job the api created runnable records the steps it skipped in job.created itself.
    for skipped in spec.skipped:
        target = TRANSITIONS[skipped].target
        if target is not None:
            timeline.entries.append(StateEntry(target, at, seq, 1))
            timeline.state = target
    return timeline


@functools.cache
def _fields(cls: type[BaseModel]) -> frozenset[str]:
    # A pydantic model asked for a field it lacks runs its __getattr__ and raises, which costs
    # microseconds on every event of a replay; which payloads have which fields is known once.
    return frozenset(cls.model_fields)


def extend(timeline: JobTimeline, seq: int, event: Event, at: float) -> None:
    """Add ``event`` (legal for the job, at sequence ``seq`` and time ``at``) to ``timeline``."""
    data = event.data
    fields = _fields(type(data))
    if "attempt" in fields:
        timeline.attempt = data.attempt  # type: ignore[attr-defined]
    attempt = timeline.attempt
    entries = timeline.entries
    for skipped in data.skipped if "skipped" in fields else ():  # type: ignore[attr-defined]
        target = TRANSITIONS[skipped].target
        if target is not None:
            entries.append(StateEntry(target, at, seq, attempt))
    target = TRANSITIONS[event.type].target
    if target is not None:
        entries.append(StateEntry(target, at, seq, attempt))
        timeline.state = target
    _runs(timeline, seq, event, at)
    if event.type in FAILURE_EVENTS:
        timeline.failures.append(_failure(seq, at, event, attempt))


def _runs(timeline: JobTimeline, seq: int, event: Event, at: float) -> None:
    data = event.data
    match event.type:
        case "job.leased":
            timeline.pending_lease_at = at
        case "job.lease_released" | "job.lease_expired":
            timeline.pending_lease_at = None
        case "job.started":
            session: uuid.UUID | None = None
            slots: tuple[str, ...] = ()
            if isinstance(data, StartedData):
                session, slots = data.session_id, _slots(data)
            timeline.runs.append(
                RunRecord(timeline.attempt, session, at, seq, timeline.pending_lease_at,
                          stamps_of(data), slots=slots)
            )  # fmt: skip
            timeline.pending_lease_at = None
        case "job.run_done" | "job.run_errored" | "job.run_timed_out":
            _end_run(timeline, event, at, _RESULTS[event.type], data)
        case "job.finished" if isinstance(data, FinishedData) and data.run is not None:
            _end_run(timeline, event, at, "done", data.run)
        case "job.killed":
            _end_run(timeline, event, at, "killed", None)


def _slots(data: StartedData) -> tuple[str, ...]:
    if not data.placement:
        return ()
    return tuple(f"{p.hostname}:{core}" if p.cores else p.hostname
                 for p in data.placement for core in (p.cores or (0,)))  # fmt: skip


def _end_run(
    timeline: JobTimeline, event: Event, at: float, outcome: RunOutcome, result: object
) -> None:
    run = timeline.runs[-1] if timeline.runs else None
    if run is None or run.ended_at is not None:
        return  # a kill of a job that was not running ends no run
    run.ended_at = at
    run.outcome = outcome
    run.reported_by_pilot = event.actor.startswith("launcher:")
    if isinstance(result, RunResultData):
        run.return_code = result.return_code
        run.runtime_s = result.runtime_s
        run.stamps = merge(run.stamps, stamps_of(result))


def _failure(seq: int, at: float, event: Event, attempt: int) -> FailureRecord:
    data = event.data
    if isinstance(data, FailureData):
        return FailureRecord(seq, at, event.type, attempt, data.reason, data.cause, None, "")
    if isinstance(data, RunResultData):
        lines = data.stderr_tail.strip().splitlines()
        return FailureRecord(seq, at, event.type, attempt, "", data.cause, data.return_code,
                             lines[-1] if lines else "", lines[0] if lines else "")  # fmt: skip
    return FailureRecord(seq, at, event.type, attempt, "", (), None, "")
