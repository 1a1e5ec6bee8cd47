"""The batch-job lifecycle as data (``schemas/batch.py``): every (state, event) pair judged,
the fold a site agent acts on, and the one builder of ``batch.requested``."""

from __future__ import annotations

import itertools
import uuid

import pytest

from lodestream.schemas.batch import (
    ACTIVE_BATCH_STATES,
    BATCH_TRANSITIONS,
    FINAL_BATCH_STATES,
    fold_batch,
    next_batch_state,
    request_batch_job,
)
from lodestream.schemas.codec import decode, encode
from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import IllegalTransition
from lodestream.schemas.events import (
    BATCH_EVENTS,
    BatchJobDeletionRequested,
    BatchJobFinished,
    BatchJobQueued,
    BatchJobRequested,
    BatchJobRunning,
    BatchJobSubmitted,
)
from lodestream.schemas.events.batch import (
    BatchFinishedData,
    BatchReasonData,
    BatchRequestData,
    BatchSubmittedData,
)
from lodestream.schemas.resources import BatchJobState

B = BatchJobState
SITE = "alpha"
REQUEST = BatchRequestData(num_nodes=2, wall_time_min=10, job_mode="serial")

# The lifecycle, written out pair by pair: (state before, event) -> state after.
ALLOWED: dict[tuple[BatchJobState | None, str], BatchJobState] = {
    (None, "batch.requested"): B.REQUESTED,
    (B.REQUESTED, "batch.submitted"): B.SUBMITTED,
    (B.REQUESTED, "batch.submit_failed"): B.SUBMIT_FAILED,
    (B.REQUESTED, "batch.deletion_requested"): B.DELETION_REQUESTED,
    **{(s, "batch.queued"): B.QUEUED for s in (B.SUBMITTED, B.QUEUED, B.RUNNING)},
    **{(s, "batch.running"): B.RUNNING for s in (B.SUBMITTED, B.QUEUED, B.RUNNING)},
    **{(s, "batch.finished"): B.FINISHED
       for s in (B.SUBMITTED, B.QUEUED, B.RUNNING, B.DELETION_REQUESTED)},
    **{(s, "batch.deletion_requested"): B.DELETION_REQUESTED
       for s in (B.SUBMITTED, B.QUEUED, B.RUNNING, B.DELETION_REQUESTED)},
    # A deletion request sticks until the end, whatever the scheduler reports meanwhile.
    **{(B.DELETION_REQUESTED, t): B.DELETION_REQUESTED
       for t in ("batch.submitted", "batch.queued", "batch.running")},
    (B.DELETION_REQUESTED, "batch.submit_failed"): B.SUBMIT_FAILED,
}  # fmt: skip


def test_every_batch_event_type_has_a_row() -> None:
    assert set(BATCH_TRANSITIONS) == {cls.event_type for cls in BATCH_EVENTS}  # type: ignore[attr-defined]
    assert set(BatchJobState) == FINAL_BATCH_STATES | ACTIVE_BATCH_STATES


@pytest.mark.parametrize(
    ("state", "event_type"),
    list(itertools.product([None, *BatchJobState], sorted(BATCH_TRANSITIONS))),
)
def test_each_pair_is_allowed_exactly_as_written_out(
    state: BatchJobState | None, event_type: str
) -> None:
    expected = ALLOWED.get((state, event_type))
    if expected is None:
        with pytest.raises(IllegalTransition, match=f"{event_type} is not allowed"):
            next_batch_state(state, event_type)
    else:
        assert next_batch_state(state, event_type) is expected


def test_nothing_leaves_a_final_state() -> None:
    for state, event_type in itertools.product(FINAL_BATCH_STATES, BATCH_TRANSITIONS):
        with pytest.raises(IllegalTransition):
            next_batch_state(state, event_type)


def test_a_job_event_is_no_batch_event() -> None:
    with pytest.raises(IllegalTransition, match="not a batch-job event"):
        next_batch_state(B.REQUESTED, "job.started")


def _history(*events: Event) -> list[tuple[int, Event]]:
    return list(enumerate(events, 100))


def _site(cls: type[Event], batch: uuid.UUID, data: object | None = None) -> Event:
    return cls.create(site=SITE, aggregate_id=batch, actor=f"site:{SITE}", data=data)  # type: ignore[arg-type]


def test_the_fold_gives_scheduler_id_observed_state_and_last_sequence() -> None:
    requested = request_batch_job(SITE, REQUEST, actor="user:ada")
    batch = requested.aggregate_id
    view = fold_batch(reversed(_history(  # any order: the fold sorts by sequence
        requested,
        _site(BatchJobSubmitted, batch, BatchSubmittedData(scheduler_id="42", scheduler="slurm")),
        _site(BatchJobQueued, batch, BatchReasonData()),
        _site(BatchJobRunning, batch, BatchReasonData()),
    )))  # fmt: skip
    assert view is not None
    assert (view.state, view.observed, view.scheduler, view.scheduler_id, view.last_seq) == (
        B.RUNNING, B.RUNNING, "slurm", "42", 103,
    )  # fmt: skip
    assert view.request == REQUEST
    assert view.requested_id == requested.id
    assert not view.final


def test_the_fold_keeps_the_deletion_and_what_the_scheduler_said_apart() -> None:
    requested = request_batch_job(SITE, REQUEST, actor="user:ada")
    batch = requested.aggregate_id
    deletion = BatchJobDeletionRequested.create(site=SITE, aggregate_id=batch, actor="user:ada")
    history = _history(
        requested,
        _site(BatchJobSubmitted, batch, BatchSubmittedData(scheduler_id="42")),
        deletion,
        _site(BatchJobRunning, batch, BatchReasonData()),
    )
    view = fold_batch(history)
    assert view is not None
    assert (view.state, view.observed, view.deletion_id) == (
        B.DELETION_REQUESTED, B.RUNNING, deletion.id,
    )  # fmt: skip
    ended = fold_batch([*history, (200, _site(
        BatchJobFinished, batch, BatchFinishedData(state="cancelled")))])  # fmt: skip
    assert ended is not None
    assert ended.final
    assert ended.state is B.FINISHED


def test_the_fold_skips_what_the_lifecycle_refuses_and_needs_a_request() -> None:
    requested = request_batch_job(SITE, REQUEST, actor="user:ada")
    batch = requested.aggregate_id
    stray = _site(BatchJobRunning, batch, BatchReasonData())  # running before submitted
    view = fold_batch(_history(requested, stray))
    assert view is not None
    assert (view.state, view.last_seq) == (B.REQUESTED, 100)
    assert fold_batch(_history(stray)) is None


def test_a_request_round_trips_through_the_codec_and_keeps_given_ids() -> None:
    batch, event_id = uuid.uuid4(), uuid.uuid4()
    data = BatchRequestData(num_nodes=1, wall_time_min=5, options={"qos": "debug"})
    event = request_batch_job(SITE, data, actor=f"site:{SITE}", batch_id=batch, event_id=event_id)
    assert (event.aggregate_id, event.id) == (batch, event_id)
    assert decode(encode(event)) == event


def test_version_one_requests_and_submissions_read_as_version_two() -> None:
    batch = uuid.uuid4()
    requested = request_batch_job(SITE, REQUEST, actor="user:ada", batch_id=batch)
    v1 = requested.model_dump(mode="json")
    v1["v"] = 1
    del v1["data"]["options"]
    assert decode(BatchJobRequested.model_validate(v1 | {"v": 2}).model_dump_json()) == requested
    import orjson  # noqa: PLC0415

    assert decode(orjson.dumps(v1)).data.options == {}  # type: ignore[attr-defined]
    submitted = _site(BatchJobSubmitted, batch, BatchSubmittedData(scheduler_id="9"))
    old = submitted.model_dump(mode="json") | {"v": 1}
    del old["data"]["scheduler"]
    assert decode(orjson.dumps(old)) == submitted


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("queue", "-p debug"),  # would read as a flag
        ("queue", "two words"),
        ("project", "a\nb"),
        ("options", {"--wrap": "x"}),
        ("options", {"qos": "a\nb"}),
        ("num_nodes", 0),
        ("wall_time_min", 0),
    ],
)
def test_a_request_that_cannot_reach_a_scheduler_intact_is_refused(
    field: str, value: object
) -> None:
    fields: dict[str, object] = {"num_nodes": 1, "wall_time_min": 5, field: value}
    with pytest.raises(ValueError, match=field):
        BatchRequestData.model_validate(fields)
