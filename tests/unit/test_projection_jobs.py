"""The projector's in-memory fold of job events (``services/projector/projection.py``).

Without Postgres: which rows a batch yields, what is quarantined and why, the position
it commits, and that folding in batches (with the state between them read back as the
store loads it) equals folding in one, which is what ``rebuild == live`` rests on. What
the store writes is tested against a real Postgres in ``tests/integration/test_projector*.py``.
"""

from __future__ import annotations

import itertools
import json
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lodestream.schemas.codec import encode
from lodestream.schemas.envelope import Event
from lodestream.schemas.events import (
    JobCreated,
    JobFailed,
    JobRunDone,
    JobRunErrored,
    JobRunTimedOut,
)
from lodestream.schemas.events.job import (
    FailureData,
    JobPlacementRefused,
    LeaseData,
    RunResultData,
)
from lodestream.schemas.states import JobState
from lodestream.schemas.subjects import EVENTS_STREAM, HB_STREAM
from lodestream.services.projector.messages import (
    Decoded,
    EventMessage,
    ExpiryMarker,
    RawMessage,
)
from lodestream.services.projector.projection import (
    REFUSED_BY,
    Changes,
    Known,
    Projection,
    ids_to_load,
)
from lodestream.services.projector.rows import JobProgress, JobRecord, QuarantineRow
from tests.support.builders import (
    job_created,
    lifecycle,
    lifecycle_finished_by_pilot,
    site_registered,
)
from tests.support.folding import (
    OWNER,
    SESSION,
    SITE,
    ev,
    fold,
    fresh,
    reasons,
)

# --- jobs ---------------------------------------------------------------------------------


def test_a_job_created_and_run_in_one_batch_is_one_new_row_with_its_history() -> None:
    projection = fresh()
    created = job_created(SITE, OWNER)
    fold(projection, [created, *lifecycle(created, SESSION)], first_seq=5)
    changes = projection.changes
    record = changes.new_jobs[created.aggregate_id]
    assert (record.owner, record.created_seq, record.created) == (OWNER, 5, created)
    view = record.progress.view
    assert (view.state, view.last_seq, view.attempts, view.lease_seq) == (
        JobState.JOB_FINISHED,
        9,
        1,
        None,
    )
    assert record.progress.return_code == 0
    assert changes.updated_jobs == {}  # a new row carries its progress
    assert [(r.seq, r.type, r.from_state, r.to_state) for r in changes.job_events] == [
        (5, "job.created", None, "CREATED"),
        (6, "job.preprocessed", "CREATED", "PREPROCESSED"),
        (7, "job.started", "PREPROCESSED", "RUNNING"),
        (8, "job.run_done", "RUNNING", "RUN_DONE"),
        (9, "job.finished", "RUN_DONE", "JOB_FINISHED"),
    ]
    assert changes.quarantine == []
    assert changes.last_seq == {EVENTS_STREAM: 9}


def test_a_job_the_pilot_finished_keeps_the_runs_return_code() -> None:
    projection = fresh()
    created = job_created(SITE, OWNER)
    fold(projection, [created, *lifecycle_finished_by_pilot(created, SESSION)])
    progress = projection.changes.new_jobs[created.aggregate_id].progress
    assert (progress.view.state, progress.return_code) == (JobState.JOB_FINISHED, 0)


def test_a_job_of_an_earlier_batch_is_an_update() -> None:
    created = job_created(SITE, OWNER)
    first = fresh()
    fold(first, [created])
    progress = first.changes.new_jobs[created.aggregate_id].progress
    later = Projection(Known({created.aggregate_id: progress}, {SITE: OWNER}), Changes())
    fold(later, lifecycle(created, SESSION)[:2], first_seq=2)
    assert later.changes.new_jobs == {}
    assert later.changes.updated_jobs[created.aggregate_id].view.state is JobState.RUNNING


def running_job() -> tuple[Projection, JobCreated]:
    projection = fresh()
    created = job_created(SITE, OWNER)
    fold(projection, [created, *lifecycle(created, SESSION)[:2]])
    return projection, created


@pytest.mark.parametrize(
    ("kind", "data", "code", "error"),
    [
        (
            JobRunErrored,
            RunResultData(return_code=3, stderr_tail="boom", cause=("oom",)),
            3,
            "boom",
        ),
        (
            JobRunErrored,
            RunResultData(return_code=3, cause=("oom", "node lost")),
            3,
            "oom; node lost",
        ),
        (
            JobRunTimedOut,
            RunResultData(cause=("launcher x drained: idle",)),
            None,
            "launcher x drained: idle",
        ),
        (JobRunErrored, RunResultData(return_code=1), 1, None),
        (JobRunDone, RunResultData(return_code=0), 0, None),
    ],
)
def test_a_runs_outcome_is_recorded_on_the_job(
    kind: type[Event], data: RunResultData, code: int | None, error: str | None
) -> None:
    projection, created = running_job()
    launcher = f"launcher:{SESSION}"
    fold(projection, [ev(kind, data, actor=launcher, aggregate=created.aggregate_id)], 4)
    progress = projection.changes.new_jobs[created.aggregate_id].progress
    assert (progress.return_code, progress.last_error) == (code, error)


def test_a_failure_records_its_reason_and_cause() -> None:
    projection = fresh()
    created = job_created(SITE, OWNER)
    failed = ev(
        JobFailed,
        FailureData(reason="parent x failed", cause=("parent x",)),
        actor="controller:main",
        aggregate=created.aggregate_id,
    )
    fold(projection, [created, failed])
    progress = projection.changes.new_jobs[created.aggregate_id].progress
    assert (progress.view.state, progress.last_error) == (
        JobState.FAILED,
        "parent x failed; parent x",
    )


def test_a_job_created_at_an_unregistered_site_is_quarantined() -> None:
    projection = fresh(owned=False)
    fold(projection, [job_created(SITE, OWNER)])
    assert reasons(projection) == [f"illegal: job.created for unregistered site {SITE!r}"]
    assert projection.changes.new_jobs == {}


def test_a_job_created_by_someone_but_the_site_owner_is_quarantined() -> None:
    projection = fresh()
    fold(projection, [job_created(SITE, "mallory")])
    assert reasons(projection) == [f"illegal: job.created by user:mallory, not site owner {OWNER}"]


def test_a_second_creation_of_a_job_is_quarantined_and_changes_nothing() -> None:
    projection = fresh()
    created = job_created(SITE, OWNER)
    fold(projection, [created, created.model_copy(update={"id": uuid.uuid4()})])
    assert reasons(projection) == [f"illegal: job {created.aggregate_id} already exists"]
    assert len(projection.changes.job_events) == 1


def test_an_event_of_an_unknown_job_is_quarantined() -> None:
    projection = fresh()
    created = job_created(SITE, OWNER)
    fold(projection, lifecycle(created)[:1])
    assert reasons(projection) == [
        f"illegal: job.preprocessed for unknown job {created.aggregate_id}"
    ]


def test_an_illegal_transition_is_quarantined_and_the_job_keeps_its_state() -> None:
    projection = fresh()
    created = job_created(SITE, OWNER)
    preprocessed, started, run_done, _ = lifecycle(created, SESSION)
    fold(projection, [created, preprocessed, run_done, started])
    (row,) = projection.changes.quarantine
    assert (row.seq, row.reason) == (
        3,
        "illegal: job.run_done is not allowed from PREPROCESSED",
    )
    assert row.raw == encode(run_done)
    progress = projection.changes.new_jobs[created.aggregate_id].progress
    assert (progress.view.state, progress.return_code) == (JobState.RUNNING, None)
    assert [r.seq for r in projection.changes.job_events] == [1, 2, 4]


def test_a_replayed_job_event_is_quarantined_not_applied_twice() -> None:
    projection = fresh()
    created = job_created(SITE, OWNER)
    history = [created, *lifecycle(created, SESSION)[:2]]
    fold(projection, history)
    fold(projection, history[1:2], first_seq=2)
    assert reasons(projection) == ["illegal: sequence 2 is not after 3"]
    assert projection.changes.new_jobs[created.aggregate_id].progress.view.last_seq == 3


def test_what_was_quarantined_on_decoding_is_kept_and_counts_for_the_position() -> None:
    projection = fresh()
    row = QuarantineRow(EVENTS_STREAM, 8, "evt.alpha.job.x.created", "bad json", b"{")
    projection.fold(RawMessage(EVENTS_STREAM, 8, row.subject, row.raw), row)
    projection.fold(RawMessage(HB_STREAM, 3, "hb.alpha.x", b""), row)
    assert projection.changes.quarantine == [row, row]
    assert projection.changes.last_seq == {EVENTS_STREAM: 8, HB_STREAM: 3}
    assert not projection.changes.empty()


def test_the_position_is_the_highest_sequence_of_each_stream() -> None:
    projection = fresh()
    for stream, seq in [(EVENTS_STREAM, 4), (EVENTS_STREAM, 2), (HB_STREAM, 9)]:
        projection.fold(RawMessage(stream, seq, "s", b""), ExpiryMarker(seq, SITE, SESSION))
    assert projection.changes.last_seq == {EVENTS_STREAM: 4, HB_STREAM: 9}


def test_a_batch_loads_only_the_aggregates_its_events_name() -> None:
    created = job_created(SITE, OWNER)
    other = site_registered("beta", OWNER)
    decoded: list[Decoded] = [
        EventMessage(1, created),
        EventMessage(2, other),
        ExpiryMarker(3, SITE, SESSION),
    ]
    assert ids_to_load(decoded) == ({created.aggregate_id}, set(), set())


def test_an_empty_batch_changes_nothing() -> None:
    assert Changes().empty()


# --- batching: live (per batch, state read back) == rebuild (one batch) -----------------


def read_back(known: Known) -> Known:
    """``known`` as the live projector loads it for the next batch: rows, not records."""
    jobs: dict[uuid.UUID, JobProgress | JobRecord] = {}
    for job_id, entry in known.jobs.items():
        progress = entry.progress if isinstance(entry, JobRecord) else entry
        _, *columns, stage_times = progress.to_copy()
        row = (job_id, progress.view.site, *columns, json.loads(stage_times))
        jobs[job_id] = JobProgress.from_row(row)
    return Known(jobs, dict(known.site_owners))


def history() -> list[Event]:
    """Three jobs interleaved, a forged creation, and an illegal event among them."""
    a, b, c = (job_created(SITE, OWNER) for _ in range(3))
    la, lb, lc = lifecycle(a, SESSION), lifecycle_finished_by_pilot(b, SESSION), lifecycle(c)
    return [
        a,
        b,
        la[0],
        lb[0],
        job_created(SITE, "mallory"),
        la[1],
        c,
        lb[1],
        la[3],
        la[2],
        lb[2],
        lc[0],
        la[3],
        lc[1],
    ]


@given(st.sets(st.integers(1, len(history()) - 1), max_size=6))
def test_folding_in_batches_equals_folding_in_one(cuts: set[int]) -> None:
    events = history()
    whole = Projection(Known(site_owners={SITE: OWNER}), Changes())
    fold(whole, events)

    known = Known(site_owners={SITE: OWNER})
    job_events, quarantine = [], []
    bounds = [0, *sorted(cuts), len(events)]
    for start, stop in itertools.pairwise(bounds):
        known = read_back(known)
        batch = Projection(known, Changes())
        fold(batch, events[start:stop], first_seq=start + 1)
        job_events += batch.changes.job_events
        quarantine += batch.changes.quarantine

    assert job_events == whole.changes.job_events
    assert quarantine == whole.changes.quarantine
    assert [q.seq for q in quarantine] == [5, 9]  # the forgery, and run_done before started
    final = {i: p.progress if isinstance(p, JobRecord) else p for i, p in known.jobs.items()}
    expected = {i: r.progress for i, r in whole.changes.new_jobs.items()}
    assert {i: p.to_copy() for i, p in final.items()} == {
        i: p.to_copy() for i, p in expected.items()
    }


def test_a_pilots_refusal_is_the_waiting_jobs_last_error_until_a_pilot_takes_it() -> None:
    projection = fresh()
    created = job_created(SITE, OWNER)
    preprocessed, started, *_ = lifecycle(created, SESSION)
    refused = ev(
        JobPlacementRefused,
        LeaseData(session_id=SESSION, reason="needs 2 nodes; this pilot has 1"),
        actor=f"launcher:{SESSION}",
        aggregate=created.aggregate_id,
    )
    fold(projection, [created, preprocessed, refused])
    progress = projection.changes.new_jobs[created.aggregate_id].progress
    assert progress.view.state is JobState.PREPROCESSED
    assert progress.last_error == f"{REFUSED_BY}{SESSION}: needs 2 nodes; this pilot has 1"
    fold(projection, [started], 4)
    taken = projection.changes.new_jobs[created.aggregate_id].progress
    assert taken.view.state is JobState.RUNNING
    assert taken.last_error is None
