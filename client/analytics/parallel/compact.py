"""A share's part as it travels back to the parent: :func:`pack` there, :func:`unpack` here.

Pickled as they are, the timelines of a million events took 6.7 s to pickle and 2.8 s to
unpickle (one process, measured): every :class:`StateEntry` (two a event) goes through a
named tuple's reduce and ``__new__``, every uuid and frozen record through Python-level
state methods, and the parent unpickles the shares one after the other. Packed, the jobs
are one tuple of plain values each, their entries four flat columns for all the jobs of the
share (an array pickles as its bytes), their runs and failures plain tuples; the parent
rebuilds the very objects the replay made. Sessions, batch jobs and the intake report are
few, and go as they are.
"""

from __future__ import annotations

import itertools
import operator
import uuid
from array import array
from dataclasses import dataclass
from typing import Any, Final

from lodestream.client.analytics.fold import Timelines
from lodestream.client.analytics.pilot_times import PilotStamps
from lodestream.client.analytics.summary import Loaded
from lodestream.client.analytics.timeline import (
    FailureRecord,
    JobTimeline,
    RunRecord,
    StateEntry,
)
from lodestream.schemas.states import JobState

_STATES: Final = tuple(JobState)
_CODES: Final = {state: code for code, state in enumerate(_STATES)}
_STATE, _AT, _SEQ, _ATTEMPT = (operator.itemgetter(i) for i in range(4))


@dataclass(frozen=True, slots=True)
class PackedPart:
    """A share's :class:`Loaded`, its jobs packed (``rest`` holds everything else)."""

    rest: Loaded
    jobs: list[tuple[Any, ...]]  # per job, _job's values; entries: how many it has
    states: bytes  # every entry of every job, in order: its state's code
    ats: array[float]
    seqs: array[int]
    attempts: array[int]


def pack(loaded: Loaded) -> PackedPart:
    """``loaded`` as plain values (in the process that replayed it)."""
    timelines = loaded.timelines
    rest = Timelines({}, timelines.sessions, timelines.batches, timelines.first_at,
                     timelines.last_at, timelines.counts)  # fmt: skip
    jobs = list(timelines.jobs.values())
    entries = list(itertools.chain.from_iterable(job.entries for job in jobs))
    return PackedPart(
        rest=Loaded(rest, loaded.intake, loaded.selection),
        jobs=[_job(job) for job in jobs],
        states=bytes(map(_CODES.__getitem__, map(_STATE, entries))),
        ats=array("d", map(_AT, entries)),
        seqs=array("q", map(_SEQ, entries)),
        attempts=array("q", map(_ATTEMPT, entries)),
    )


def unpack(part: PackedPart) -> Loaded:
    """The :class:`Loaded` that was packed into ``part`` (in the parent)."""
    states = map(_STATES.__getitem__, part.states)
    rows = zip(states, part.ats, part.seqs, part.attempts, strict=True)
    # tuple.__new__ is what StateEntry's own __new__ calls, without a Python frame each.
    entries = list(map(tuple.__new__, itertools.repeat(StateEntry), rows))
    sessions: dict[int, uuid.UUID] = {}  # a few sessions run many jobs: one uuid each
    jobs: dict[uuid.UUID, JobTimeline] = {}
    at = 0
    for packed in part.jobs:
        (job_id, site, app, tags, num_nodes, ranks, packing, wall_time, created_at,
         created_seq, state, attempt, count, runs, failures, pending_lease_at) = packed  # fmt: skip
        key = uuid.UUID(int=job_id)
        jobs[key] = JobTimeline(
            key, site, app, tags, num_nodes, ranks, packing, wall_time, created_at,
            created_seq, state, attempt, entries[at : at + count],
            [_run(run, sessions) for run in runs], [FailureRecord(*f) for f in failures],
            pending_lease_at,
        )  # fmt: skip
        at += count
    timelines = part.rest.timelines
    timelines.jobs = jobs
    return part.rest


def _job(job: JobTimeline) -> tuple[Any, ...]:
    runs = [
        (r.attempt, None if r.session_id is None else r.session_id.int, r.started_at,
         r.started_seq, r.lease_event_at, tuple(r.stamps), r.ended_at, r.outcome,
         r.reported_by_pilot, r.return_code, r.runtime_s, r.slots)
        for r in job.runs
    ]  # fmt: skip
    failures = [
        (
            f.seq,
            f.at,
            f.type,
            f.attempt,
            f.reason,
            f.cause,
            f.return_code,
            f.stderr_tail,
            f.stderr_first,
        )
        for f in job.failures
    ]
    return (job.job_id.int, job.site, job.app, job.tags, job.num_nodes, job.ranks,
            job.node_packing_count, job.wall_time_min, job.created_at, job.created_seq,
            job.state, job.attempt, len(job.entries), runs, failures,
            job.pending_lease_at)  # fmt: skip


def _run(packed: tuple[Any, ...], sessions: dict[int, uuid.UUID]) -> RunRecord:
    (attempt, session, started_at, started_seq, lease_event_at, stamps, ended_at, outcome,
     reported, return_code, runtime_s, slots) = packed  # fmt: skip
    session_id = None
    if session is not None:
        session_id = sessions.get(session)
        if session_id is None:
            session_id = sessions[session] = uuid.UUID(int=session)
    return RunRecord(attempt, session_id, started_at, started_seq, lease_event_at,
                     tuple.__new__(PilotStamps, stamps), ended_at, outcome, reported,
                     return_code, runtime_s, slots)  # fmt: skip
