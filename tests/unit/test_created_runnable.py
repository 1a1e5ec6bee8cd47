"""Jobs created runnable (issue 15, lever 1): ``job.created`` skipping
``CREATED_RUNNABLE`` lands in PREPROCESSED, and nothing else does.

The fold (``schemas/fold.py``) for every skip a ``job.created`` could claim; the projector's
quarantine of the illegal ones; the api's decision (``services/api/submit.py``); and what a
pilot makes of a ``job.created`` delivered on ``launch-<site>`` (``agents/launcher/work.py``).
"""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from lodestream.agents.launcher.work import NotRunnable, NotWork, work_item
from lodestream.schemas.codec import encode
from lodestream.schemas.errors import IllegalTransition
from lodestream.schemas.events.job import (
    CreatedData,
    FinishedData,
    JobCreated,
    JobFinished,
    JobKilled,
    JobReset,
    JobStarted,
    RunResultData,
    StartedData,
)
from lodestream.schemas.fold import apply, fold
from lodestream.schemas.resources import TransferSpec
from lodestream.schemas.states import (
    CREATED_RUNNABLE,
    FINISHED_AT_RUN_END,
    RUNNABLE,
    SKIPPABLE,
    TRANSITIONS,
    JobState,
)
from lodestream.services.api.models import JobSubmission, SubmitRequest
from lodestream.services.api.submit import AppInterface, Catalog, build_events, created_runnable
from tests.support.folding import OWNER, SITE, fresh, reasons
from tests.support.folding import fold as project
from tests.unit.test_state_machine import job_event  # the table test's minimal payloads

JOB_ID = uuid.UUID("01900000-0000-7000-8000-000000000001")
PARENT_ID = uuid.UUID("01900000-0000-7000-8000-000000000002")
SESSION = uuid.UUID("01900000-0000-7000-8000-0000000000a1")
AT = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
STAGE_IN = {"inp": TransferSpec(location="beamline", path="/data/in.h5")}


def created(skipped: tuple[str, ...] = CREATED_RUNNABLE, **spec: Any) -> JobCreated:
    data = CreatedData(site=SITE, app="demo", workdir="w", skipped=skipped, **spec)
    return JobCreated.create(
        site=SITE, aggregate_id=JOB_ID, actor=f"user:{OWNER}", data=data, occurred_at=AT
    )


# --- the fold -------------------------------------------------------------------------------


def test_created_runnable_is_preprocessed_free_and_keeps_its_creation_time() -> None:
    view = apply(None, created(), 1)
    assert view.state == JobState.PREPROCESSED
    assert view.state in RUNNABLE
    assert (view.lease_seq, view.lease_session, view.attempts, view.last_seq) == (None, None, 0, 1)
    assert view.stage_times == {"CREATED": AT, "PREPROCESSED": AT}


def test_created_with_nothing_skipped_is_created_as_before() -> None:
    view = apply(None, created(skipped=()), 1)
    assert view.state == JobState.CREATED
    assert view.stage_times == {"CREATED": AT}


# Every sequence of up to four distinct skippable steps, and a few that are not steps.
CLAIMS = [
    claim for length in range(1, 5) for claim in itertools.permutations(sorted(SKIPPABLE), length)
] + [
    ("job.created",),
    ("job.started",),
    ("job.killed",),
    ("job.awaiting_parents", *CREATED_RUNNABLE),
    (*CREATED_RUNNABLE, "job.started"),
    ("job.ready", "job.ready", "job.staged_in", "job.preprocessed"),
]


@pytest.mark.parametrize("claim", CLAIMS, ids="+".join)
def test_job_created_may_skip_exactly_created_runnable(claim: tuple[str, ...]) -> None:
    event = created(skipped=claim)
    if claim == CREATED_RUNNABLE:
        assert apply(None, event, 1).state == JobState.PREPROCESSED
    else:
        with pytest.raises(IllegalTransition, match=r"job\.created may skip"):
            apply(None, event, 1)


def test_the_claims_cover_every_order_of_the_legal_skip() -> None:
    orders = set(itertools.permutations(CREATED_RUNNABLE))
    assert orders <= set(CLAIMS)
    assert (*CREATED_RUNNABLE, "job.leased") in CLAIMS  # legal as steps, not for a creation


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ({"parent_ids": (PARENT_ID,)}, "has parents"),
        ({"transfers": STAGE_IN}, "has transfer items"),
        ({"parent_ids": (PARENT_ID,), "transfers": STAGE_IN}, "has parents"),
    ],
)
def test_a_job_that_must_wait_or_stage_is_never_created_runnable(
    spec: dict[str, Any], why: str
) -> None:
    with pytest.raises(IllegalTransition, match=why):
        apply(None, created(**spec), 1)
    assert apply(None, created(skipped=(), **spec), 1).state == JobState.CREATED


def test_three_events_take_a_job_created_runnable_to_the_end() -> None:
    history = [
        created(),
        JobStarted.create(
            site=SITE, aggregate_id=JOB_ID, actor=f"launcher:{SESSION}",
            data=StartedData(session_id=SESSION, skipped=("job.leased",)),
        ),
        JobFinished.create(
            site=SITE, aggregate_id=JOB_ID, actor=f"launcher:{SESSION}",
            data=FinishedData(skipped=FINISHED_AT_RUN_END, run=RunResultData(return_code=0)),
        ),
    ]  # fmt: skip
    view = fold(enumerate(history, start=1))
    assert view is not None
    assert view.state == JobState.JOB_FINISHED
    assert (view.lease_seq, view.attempts, view.last_seq) == (None, 1, 3)
    assert set(view.stage_times) == {"CREATED", "PREPROCESSED", "RUNNING", "JOB_FINISHED"}


@pytest.mark.parametrize("event_type", sorted(TRANSITIONS))
def test_a_job_created_runnable_moves_on_as_any_preprocessed_job(event_type: str) -> None:
    # The same verdict for every event type as for a job made PREPROCESSED by the controller.
    runnable = apply(None, created(), 1)
    step = job_event(event_type, job_id=JOB_ID)
    try:
        expected: JobState | str = apply(
            apply(apply(None, created(skipped=()), 1), job_event(
                "job.preprocessed", job_id=JOB_ID, skipped=("job.ready", "job.staged_in")
            ), 2), step, 3,
        ).state  # fmt: skip
    except IllegalTransition:
        expected = "refused"
    try:
        actual: JobState | str = apply(runnable, step, 3).state
    except IllegalTransition:
        actual = "refused"
    assert actual == expected


def test_kill_and_reset_send_a_job_created_runnable_back_the_long_way() -> None:
    view = apply(None, created(), 1)
    view = apply(view, JobKilled.create(site=SITE, aggregate_id=JOB_ID, actor="api:x"), 2)
    view = apply(view, JobReset.create(site=SITE, aggregate_id=JOB_ID, actor="api:x"), 3)
    assert view.state == JobState.READY  # the controller moves it on from here, as any reset job


# --- the projector --------------------------------------------------------------------------


def test_the_projector_creates_a_runnable_row_for_a_job_created_runnable() -> None:
    projection = fresh()
    event = created()
    project(projection, [event])
    assert projection.changes.quarantine == []
    record = projection.changes.new_jobs[JOB_ID]
    assert record.progress.view.state == JobState.PREPROCESSED
    (row,) = projection.changes.job_events
    assert (row.type, row.from_state, row.to_state) == ("job.created", None, "PREPROCESSED")


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (
            created(parent_ids=(PARENT_ID,)),
            "illegal: job.created skips to runnable a job that has parents",
        ),
        (
            created(transfers=STAGE_IN),
            "illegal: job.created skips to runnable a job that has transfer items",
        ),
        (
            created(skipped=("job.ready", "job.staged_in")),
            "illegal: job.created may skip job.ready, job.staged_in, job.preprocessed or "
            "nothing, not job.ready, job.staged_in",
        ),
        (
            created(skipped=(*CREATED_RUNNABLE, "job.leased")),
            "illegal: job.created may skip job.ready, job.staged_in, job.preprocessed or "
            "nothing, not job.ready, job.staged_in, job.preprocessed, job.leased",
        ),
    ],
    ids=["parents", "stage-in", "partial", "lease"],
)
def test_the_projector_quarantines_an_illegal_skip_and_creates_nothing(
    event: JobCreated, reason: str
) -> None:
    projection = fresh()
    project(projection, [event])
    assert reasons(projection) == [reason]
    assert projection.changes.new_jobs == {}
    assert projection.changes.job_events == []


# --- the api's decision ---------------------------------------------------------------------

NO_HOOKS = AppInterface.from_row({}, {"inp": {"direction": "in"}, "out": {"direction": "out"}})
PREPROCESS = AppInterface.from_row({}, {}, ["preprocess", "postprocess"])


@pytest.mark.parametrize(
    ("job", "app", "runnable"),
    [
        ({}, NO_HOOKS, True),
        ({}, AppInterface.from_row({}, {}, ["postprocess", "handle_error"]), True),
        ({}, PREPROCESS, False),
        ({}, None, False),  # an app the api does not know: the controller decides
        ({"parent_ids": [str(PARENT_ID)]}, NO_HOOKS, False),
        ({"transfers": {"inp": {"location": "b", "path": "/x"}}}, NO_HOOKS, False),
        ({"transfers": {"out": {"location": "b", "path": "/x"}}}, NO_HOOKS, False),
    ],
    ids=["no-op", "hooks-after-run", "preprocess", "unknown-app", "parents", "stage-in",
         "stage-out"],
)  # fmt: skip
def test_the_api_creates_runnable_only_a_job_with_nothing_before_its_run(
    job: dict[str, Any], app: AppInterface | None, runnable: bool
) -> None:
    submission = JobSubmission.model_validate({"site": SITE, "app": "demo", "workdir": "w"} | job)
    assert created_runnable(submission, app) is runnable
    apps = {SITE: {"demo": app}} if app is not None else {}
    catalog = Catalog(sites=frozenset({SITE}), apps=apps, own_jobs=frozenset({PARENT_ID}))
    plan = build_events(
        SubmitRequest(jobs=[submission]), [JOB_ID], catalog, user=OWNER, now=AT, secret=b"s"
    )
    (event,) = plan.to_append
    assert event.data.skipped == (CREATED_RUNNABLE if runnable else ())
    # What reaches the log is what the fold accepts, in the state the decision meant.
    decoded = JobCreated.model_validate_json(encode(event))
    state = apply(None, decoded, 1).state
    assert state == (JobState.PREPROCESSED if runnable else JobState.CREATED)


def test_a_client_cannot_ask_for_a_job_to_be_created_runnable() -> None:
    with pytest.raises(ValueError, match="skipped"):
        JobSubmission.model_validate(
            {"site": SITE, "app": "demo", "workdir": "w", "skipped": list(CREATED_RUNNABLE)}
        )


# --- the pilot ------------------------------------------------------------------------------


def delivery(event: JobCreated, seq: int = 41) -> Any:
    metadata = SimpleNamespace(sequence=SimpleNamespace(stream=seq), num_delivered=1)
    return SimpleNamespace(subject=event.subject, data=encode(event), metadata=metadata)


def test_a_pilot_takes_a_job_created_runnable_as_work_it_need_not_read_back() -> None:
    event = created()
    item = work_item(delivery(event), SITE)
    assert (item.job_id, item.seq, item.attempt, item.submitted) == (JOB_ID, 41, 1, True)
    assert item.spec == event.data


def test_a_pilot_acks_a_job_created_that_is_not_runnable_as_not_its_work() -> None:
    with pytest.raises(NotRunnable):
        work_item(delivery(created(skipped=())), SITE)


def test_a_pilot_refuses_a_job_created_runnable_that_the_projector_quarantines() -> None:
    with pytest.raises(NotWork, match="has parents") as caught:
        work_item(delivery(created(parent_ids=(PARENT_ID,))), SITE)
    assert not isinstance(caught.value, NotRunnable)  # terminated and counted, not quiet
