"""The controller's decisions (``services/controller/decide.py``), without NATS or Postgres.

Every append is also folded by the state machine (``schemas/fold.py``) from the state the
cause left the job in, chained on the cause's sequence: a decision the log's readers
would quarantine, or one that chains on the wrong sequence, fails here.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from lodestream.eventlog.kernel import Append
from lodestream.schemas.envelope import Event
from lodestream.schemas.events import (
    JobAwaitingParents,
    JobCreated,
    JobFailed,
    JobFinished,
    JobPostprocessed,
    JobPreprocessed,
    JobReady,
    JobReset,
    JobRunDone,
    JobStagedIn,
    JobStagedOut,
    SessionExpired,
)
from lodestream.schemas.events.job import (
    FailureData,
    FinishedData,
    LeaseData,
    ParentsData,
    ReasonData,
    RunResultData,
    StepData,
)
from lodestream.schemas.events.session import SessionExpiredData
from lodestream.schemas.fold import JobView, apply
from lodestream.schemas.resources import App, AppTransferSlot, JobSpec, JobSteps, TransferSpec
from lodestream.schemas.states import JobState
from lodestream.services.controller import decide
from lodestream.services.controller.decide import ACTOR, LeasedJob

SITE = "alpha"
JOB = uuid.UUID("01900000-0000-7000-8000-000000000001")
P1 = uuid.UUID("01900000-0000-7000-8000-0000000000f1")
P2 = uuid.UUID("01900000-0000-7000-8000-0000000000f2")
SESSION = uuid.UUID("01900000-0000-7000-8000-0000000000a1")
SEQ = 40
AT = datetime(2025, 1, 2, tzinfo=UTC)
REMOTE = TransferSpec(location="globus:endpoint", path="/data")
NO_STEPS = JobSteps()


def app_with(steps: JobSteps) -> App:
    """An app whose jobs (see :func:`spec_for`) go through exactly ``steps``."""
    hooks = tuple(
        h for h, on in (("preprocess", steps.preprocess), ("postprocess", steps.postprocess)) if on
    )
    transfers = {
        "inputs": AppTransferSlot(direction="in", local_path="in"),
        "outputs": AppTransferSlot(direction="out", local_path="out"),
    }
    return App(site=SITE, name="demo", hooks=hooks, transfers=transfers)


def spec_for(steps: JobSteps, parents: tuple[uuid.UUID, ...] = ()) -> JobSpec:
    transfers = {
        slot: REMOTE
        for slot, on in (("inputs", steps.stage_in), ("outputs", steps.stage_out))
        if on
    }
    return JobSpec(site=SITE, app="demo", workdir="w", parent_ids=parents, transfers=transfers)


def cause(kind: type[Event], data: BaseModel | None = None, job: uuid.UUID = JOB) -> Event:
    return kind.create(
        site=SITE, aggregate_id=job, actor="controller:test", data=data, occurred_at=AT
    )


def view_in(state: JobState, *, leased: bool = False) -> JobView:
    return JobView(
        id=JOB,
        site=SITE,
        state=state,
        last_seq=SEQ,
        lease_seq=SEQ - 1 if leased else None,
        lease_session=SESSION if leased else None,
    )


def folded(view: JobView, appends: list[Append]) -> JobView:
    """Apply ``appends`` as the log would: each chained on the job's last sequence."""
    for append in appends:
        assert append.expect == view.last_seq
        view = apply(view, append.event, view.last_seq + 1)
    return view


def test_append_events_come_from_the_controller_and_name_their_cause() -> None:
    created = cause(JobCreated, spec_for(NO_STEPS))
    (append,) = decide.on_created_or_waiting(
        created, JOB, SEQ, spec_for(NO_STEPS), None, parents={}, waiting=False
    )
    assert (append.event.actor, append.event.causation_id) == (ACTOR, created.id)
    assert (append.event.site, append.event.aggregate_id) == (SITE, JOB)


# --- release: from creation to the first real step ---------------------------------------


def test_a_job_with_nothing_to_do_before_its_run_is_runnable_in_one_event() -> None:
    spec = spec_for(NO_STEPS)
    appends = decide.advance(
        cause(JobCreated, spec), JOB, SEQ, spec, app_with(NO_STEPS), from_ready=False
    )
    (append,) = appends
    assert isinstance(append.event, JobPreprocessed)
    assert append.event.data == StepData(skipped=("job.ready", "job.staged_in"), work=spec)
    assert folded(view_in(JobState.CREATED), appends).state is JobState.PREPROCESSED


def test_a_job_with_a_preprocess_hook_waits_for_the_site_staged_in() -> None:
    steps = JobSteps(preprocess=True)
    spec = spec_for(steps)
    (append,) = decide.advance(
        cause(JobCreated, spec), JOB, SEQ, spec, app_with(steps), from_ready=False
    )
    assert isinstance(append.event, JobStagedIn)
    assert append.event.data == StepData(skipped=("job.ready",), work=spec)


def test_a_job_with_inputs_is_made_ready_for_the_sites_transfer_module() -> None:
    steps = JobSteps(stage_in=True, preprocess=True)
    spec = spec_for(steps)
    (append,) = decide.advance(
        cause(JobCreated, spec), JOB, SEQ, spec, app_with(steps), from_ready=False
    )
    assert isinstance(append.event, JobReady)


def test_a_ready_job_with_inputs_is_left_to_the_transfer_module() -> None:
    steps = JobSteps(stage_in=True)
    spec = spec_for(steps)
    assert (
        decide.advance(cause(JobCreated, spec), JOB, SEQ, spec, app_with(steps), from_ready=True)
        == []
    )


def test_a_job_whose_app_is_not_known_yet_skips_every_step() -> None:
    steps = JobSteps(stage_in=True, preprocess=True)
    spec = spec_for(steps)
    (append,) = decide.advance(cause(JobCreated, spec), JOB, SEQ, spec, None, from_ready=False)
    assert isinstance(append.event, JobPreprocessed)


STEPS = st.builds(JobSteps, st.booleans(), st.booleans(), st.booleans(), st.booleans())


@given(STEPS)
def test_a_created_job_stops_before_its_first_real_step(steps: JobSteps) -> None:
    spec = spec_for(steps)
    appends = decide.on_created_or_waiting(
        cause(JobCreated, spec), JOB, SEQ, spec, app_with(steps), parents={}, waiting=False
    )
    after = folded(view_in(JobState.CREATED), appends)
    if steps.stage_in:
        assert after.state is JobState.READY  # the site stages in
    elif steps.preprocess:
        assert after.state is JobState.STAGED_IN  # the site's preprocess hook runs
    else:
        assert after.state is JobState.PREPROCESSED  # runnable: a pilot takes it


@given(STEPS)
def test_a_reset_job_goes_on_from_ready(steps: JobSteps) -> None:
    spec = spec_for(steps)
    reset = cause(JobReset, ReasonData(reason="retry it"))
    appends = decide.advance(reset, JOB, SEQ, spec, app_with(steps), from_ready=True)
    after = folded(view_in(JobState.READY), appends)
    expected = (
        JobState.READY
        if steps.stage_in
        else JobState.STAGED_IN
        if steps.preprocess
        else JobState.PREPROCESSED
    )
    assert after.state is expected


@given(STEPS)
def test_deciding_twice_mints_the_very_same_events(steps: JobSteps) -> None:
    spec = spec_for(steps)
    created = cause(JobCreated, spec)
    first = decide.on_created_or_waiting(
        created, JOB, SEQ, spec, app_with(steps), parents={}, waiting=False
    )
    again = decide.on_created_or_waiting(
        created, JOB, SEQ, spec, app_with(steps), parents={}, waiting=False
    )
    assert [(a.event.id, a.expect) for a in first] == [(a.event.id, a.expect) for a in again]
    other = decide.on_created_or_waiting(
        cause(JobCreated, spec), JOB, SEQ, spec, app_with(steps), parents={}, waiting=False
    )
    assert {a.event.id for a in other}.isdisjoint(a.event.id for a in first)


# --- the DAG ------------------------------------------------------------------------------


def created_with_parents(*parents: uuid.UUID) -> tuple[Event, JobSpec]:
    spec = spec_for(NO_STEPS, parents)
    return cause(JobCreated, spec), spec


def test_a_child_of_unfinished_parents_awaits_them() -> None:
    created, spec = created_with_parents(P1, P2)
    parents = {P1: JobState.JOB_FINISHED, P2: JobState.RUNNING}
    appends = decide.on_created_or_waiting(
        created, JOB, SEQ, spec, None, parents=parents, waiting=False
    )
    (append,) = appends
    assert isinstance(append.event, JobAwaitingParents)
    assert append.event.data == ParentsData(parent_ids=(P1, P2))
    assert folded(view_in(JobState.CREATED), appends).state is JobState.AWAITING_PARENTS


def test_a_waiting_child_keeps_waiting_without_an_event() -> None:
    created, spec = created_with_parents(P1)
    assert (
        decide.on_created_or_waiting(
            created, JOB, SEQ, spec, None, parents={P1: JobState.RUNNING}, waiting=True
        )
        == []
    )


@pytest.mark.parametrize("waiting", [False, True])
def test_a_child_whose_parents_all_finished_is_released(*, waiting: bool) -> None:
    created, spec = created_with_parents(P1, P2)
    finished = {P1: JobState.JOB_FINISHED, P2: JobState.JOB_FINISHED}
    appends = decide.on_created_or_waiting(
        created, JOB, SEQ, spec, None, parents=finished, waiting=waiting
    )
    state = JobState.AWAITING_PARENTS if waiting else JobState.CREATED
    assert folded(view_in(state), appends).state is JobState.PREPROCESSED


@pytest.mark.parametrize("state", [JobState.FAILED, JobState.KILLED])
def test_a_child_of_a_failed_or_killed_parent_fails(state: JobState) -> None:
    created, spec = created_with_parents(P1, P2)
    appends = decide.on_created_or_waiting(
        created, JOB, SEQ, spec, None, parents={P1: JobState.RUNNING, P2: state}, waiting=True
    )
    (append,) = appends
    assert isinstance(append.event, JobFailed)
    assert append.event.data == FailureData(
        reason=f"parent {P2} {state.value}", cause=(f"parent {P2}",), parent_id=P2
    )
    assert folded(view_in(JobState.AWAITING_PARENTS), appends).state is JobState.FAILED


def test_a_child_of_a_parent_that_does_not_exist_fails() -> None:
    created, spec = created_with_parents(P1)
    (append,) = decide.on_created_or_waiting(
        created, JOB, SEQ, spec, None, parents={}, waiting=False
    )
    assert isinstance(append.event, JobFailed)
    assert append.event.data.reason == f"parent {P1} not found"


def test_a_failed_parent_is_named_before_a_missing_one() -> None:
    created, spec = created_with_parents(P1, P2)
    (append,) = decide.on_created_or_waiting(
        created, JOB, SEQ, spec, None, parents={P2: JobState.FAILED}, waiting=False
    )
    assert isinstance(append.event.data, FailureData)
    assert append.event.data.parent_id == P2


PARENT_STATES = st.sampled_from(list(JobState)) | st.none()  # None: no such job


@given(st.lists(PARENT_STATES, min_size=1, max_size=4), st.booleans())
def test_a_child_fails_waits_or_goes_on_as_its_parents_say(
    states: list[JobState | None], waiting: bool
) -> None:
    ids = [uuid.UUID(int=i + 1) for i in range(len(states))]
    parents = {p: s for p, s in zip(ids, states, strict=True) if s is not None}
    created, spec = created_with_parents(*ids)
    appends = decide.on_created_or_waiting(
        created, JOB, SEQ, spec, None, parents=parents, waiting=waiting
    )
    start = JobState.AWAITING_PARENTS if waiting else JobState.CREATED
    after = folded(view_in(start), appends)
    if any(s is None or s in decide.FAILED_STATES for s in states):
        assert after.state is JobState.FAILED
    elif all(s is JobState.JOB_FINISHED for s in states):
        assert after.state is JobState.PREPROCESSED
    else:
        assert after.state is JobState.AWAITING_PARENTS
        assert len(appends) == (0 if waiting else 1)


def test_a_parent_that_finished_releases_or_fails_each_waiting_child() -> None:
    c1, c2, c3 = (uuid.UUID(int=100 + i) for i in range(3))
    parent_done = cause(JobFinished, FinishedData(), job=P1)
    children = [
        (c1, 7, spec_for(NO_STEPS, (P1,))),
        (c2, 8, spec_for(NO_STEPS, (P1, P2))),
        (c3, 9, spec_for(JobSteps(preprocess=True), (P1,))),
    ]
    parents = {P1: JobState.JOB_FINISHED, P2: JobState.KILLED}
    apps = {(SITE, "demo"): app_with(JobSteps(preprocess=True))}
    appends = decide.on_parent_done(parent_done, children, parents, apps)
    assert [(a.event.type, a.event.aggregate_id, a.expect) for a in appends] == [
        ("job.staged_in", c1, 7),
        ("job.failed", c2, 8),
        ("job.staged_in", c3, 9),
    ]
    assert all(a.event.causation_id == parent_done.id for a in appends)


# --- after the run ------------------------------------------------------------------------


@given(STEPS)
def test_after_run_done_the_job_goes_to_its_next_real_step(steps: JobSteps) -> None:
    spec = spec_for(steps)
    done = cause(JobRunDone, RunResultData(return_code=0, work=spec))
    appends = decide.on_run_done(done, SEQ, spec, app_with(steps))
    after = folded(view_in(JobState.RUN_DONE), appends)
    if steps.postprocess:
        assert appends == []  # the site's postprocess hook
    elif steps.stage_out:
        assert after.state is JobState.POSTPROCESSED  # the site stages out
    else:
        assert after.state is JobState.JOB_FINISHED


def test_run_done_without_postprocess_or_stage_out_finishes_skipping_both() -> None:
    spec = spec_for(NO_STEPS)
    (append,) = decide.on_run_done(cause(JobRunDone, RunResultData()), SEQ, spec, None)
    assert isinstance(append.event, JobFinished)
    assert append.event.data == FinishedData(
        skipped=("job.postprocessed", "job.staged_out"), work=spec
    )


def test_run_done_with_stage_out_is_postprocessed_for_the_transfer_module() -> None:
    steps = JobSteps(stage_out=True)
    spec = spec_for(steps)
    (append,) = decide.on_run_done(cause(JobRunDone, RunResultData()), SEQ, spec, app_with(steps))
    assert isinstance(append.event, JobPostprocessed)
    assert append.event.data == StepData(note="no postprocess hook", work=spec)


@given(STEPS)
def test_after_postprocess_the_job_finishes_unless_it_stages_out(steps: JobSteps) -> None:
    spec = spec_for(steps)
    appends = decide.on_postprocessed(
        cause(JobPostprocessed, StepData()), SEQ, spec, app_with(steps)
    )
    if steps.stage_out:
        assert appends == []
    else:
        (append,) = appends
        assert append.event.data == FinishedData(skipped=("job.staged_out",), work=spec)
        assert folded(view_in(JobState.POSTPROCESSED), appends).state is JobState.JOB_FINISHED


def test_a_staged_out_job_finishes() -> None:
    spec = spec_for(JobSteps(stage_out=True))
    appends = decide.on_staged_out(cause(JobStagedOut, StepData()), SEQ, spec)
    (append,) = appends
    assert append.event.data == FinishedData(work=spec)
    assert folded(view_in(JobState.STAGED_OUT), appends).state is JobState.JOB_FINISHED


# --- a dead session: lease expiry and fencing ---------------------------------------------


def held(job: uuid.UUID, state: JobState, last_seq: int) -> LeasedJob:
    return LeasedJob(id=job, state=state, last_seq=last_seq, attempt=2, spec=spec_for(NO_STEPS))


J1, J2, J3 = (uuid.UUID(int=200 + i) for i in range(3))
HELD = [
    held(J1, JobState.RUNNING, 11),
    held(J2, JobState.PREPROCESSED, 12),
    held(J3, JobState.RESTART_READY, 13),
]


def test_a_dead_sessions_running_jobs_time_out_and_its_leases_expire() -> None:
    appends = decide.on_session_expired(SITE, SESSION, 99, HELD, AT)
    assert [(a.event.type, a.event.aggregate_id, a.expect) for a in appends] == [
        ("job.run_timed_out", J1, 11),
        ("job.lease_expired", J2, 12),
        ("job.lease_expired", J3, 13),
        ("session.expired", SESSION, 0),  # never opened, as far as the read model knows
    ]
    reason = f"session {SESSION} heartbeat expired"
    spec = spec_for(NO_STEPS)
    assert appends[0].event.data == RunResultData(cause=(reason,), work=spec, attempt=2)
    assert appends[1].event.data == LeaseData(
        session_id=SESSION, reason=reason, work=spec, attempt=2
    )
    assert appends[-1].event.data == SessionExpiredData(leases_expired=2, runs_timed_out=1)
    assert all(a.event.occurred_at == AT and a.event.actor == ACTOR for a in appends)


def test_a_dead_session_that_held_nothing_only_expires() -> None:
    (append,) = decide.on_session_expired(SITE, SESSION, 99, [], AT)
    assert isinstance(append.event, SessionExpired)
    assert append.event.data == SessionExpiredData()


def test_a_sessions_expiry_is_compare_and_set_on_its_newest_event() -> None:
    (append,) = decide.on_session_expired(SITE, SESSION, 99, [], AT, session_seq=41)
    assert (append.event.type, append.expect) == ("session.expired", 41)


def test_a_session_that_ended_is_not_expired_again_but_what_it_holds_is_fenced() -> None:
    """A pilot that closed its session leaves its last heartbeat to age out like any: the
    marker that follows must not turn the closed session into an expired one."""
    assert decide.on_session_expired(SITE, SESSION, 99, [], AT, session_seq=None) == []
    appends = decide.on_session_expired(SITE, SESSION, 99, HELD, AT, session_seq=None)
    assert [a.event.type for a in appends] == [
        "job.run_timed_out",
        "job.lease_expired",
        "job.lease_expired",
    ]


@pytest.mark.parametrize("state", [JobState.RUNNING, JobState.PREPROCESSED, JobState.RESTART_READY])
def test_fencing_is_legal_for_the_holder_and_frees_the_job(state: JobState) -> None:
    appends = decide.on_session_expired(SITE, SESSION, 99, [held(JOB, state, SEQ)], AT)
    after = folded(view_in(state, leased=True), appends[:-1])
    assert after.lease_seq is None
    assert after.state is (JobState.RUN_TIMEOUT if state is JobState.RUNNING else state)


def test_fencing_names_the_batch_job_the_session_ran_in() -> None:
    batch = "batch job 01900000-0000-7000-8000-0000000000b1 (slurm 77): walltime_expired"
    appends = decide.on_session_expired(SITE, SESSION, 99, HELD, AT, batch=batch)
    reason = f"session {SESSION} heartbeat expired"
    assert isinstance(appends[0].event.data, RunResultData)
    assert appends[0].event.data.cause == (reason, batch)
    assert isinstance(appends[1].event.data, LeaseData)
    assert appends[1].event.data.reason == f"{reason}; {batch}"
    plain = decide.on_session_expired(SITE, SESSION, 99, HELD, AT)
    assert [a.event.id for a in appends] == [a.event.id for a in plain]  # same facts, same ids


def test_fencing_ids_follow_the_marker_and_each_jobs_position() -> None:
    first = decide.on_session_expired(SITE, SESSION, 99, HELD, AT)
    again = decide.on_session_expired(SITE, SESSION, 99, HELD, AT)
    assert [a.event.id for a in first] == [a.event.id for a in again]
    # A later marker of the same session, or the job having moved on, is a new fact.
    later = decide.on_session_expired(SITE, SESSION, 100, HELD, AT)
    assert {a.event.id for a in later}.isdisjoint(a.event.id for a in first)
    moved = decide.on_session_expired(SITE, SESSION, 99, [held(J1, JobState.RUNNING, 21)], AT)
    assert moved[0].event.id != first[0].event.id
    assert moved[-1].event.id == first[-1].event.id  # one session.expired per marker
