"""The job state machine (``lodestream.schemas.states.TRANSITIONS``) as enforced by
``lodestream.schemas.fold.apply``.

Exhaustive: every job event type x every state (and no job yet) x lease held or
not is applied to a view built directly, and must be accepted exactly when the
table allows it, with the table's target state and lease effect.
"""

from __future__ import annotations

import uuid
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from pydantic import BaseModel

from lodestream.schemas.codec import EVENT_CLASSES
from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import IllegalTransition
from lodestream.schemas.events.batch import BatchJobQueued
from lodestream.schemas.events.job import (
    JOB_EVENTS,
    FailureData,
    FinishedData,
    JobFinished,
    LeaseData,
    ParentsData,
    ReasonData,
    RetryData,
    RunResultData,
    StartedData,
    StepData,
)
from lodestream.schemas.fold import JobView, apply, fold
from lodestream.schemas.resources import JobSpec
from lodestream.schemas.states import (
    FINAL,
    FINISHED_AT_RUN_END,
    RUNNABLE,
    SKIPPABLE,
    TRANSITIONS,
    JobState,
    Transition,
)

SITE = "alpha"
JOB_ID = uuid.UUID("01900000-0000-7000-8000-000000000001")
PARENT_ID = uuid.UUID("01900000-0000-7000-8000-000000000002")
HOLDER = uuid.UUID("01900000-0000-7000-8000-0000000000a1")
OTHER_SESSION = uuid.UUID("01900000-0000-7000-8000-0000000000b2")
LEASE_SEQ = 7
LAST_SEQ = 10
SEQ = 11
AT = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
ENTERED = datetime(2025, 1, 1, tzinfo=UTC)


def job_data(
    event_type: str, *, site: str = SITE, session: uuid.UUID = HOLDER, skipped: tuple[str, ...] = ()
) -> BaseModel:
    """Valid minimal payload for a job event type."""
    match event_type:
        case "job.created":
            return JobSpec(site=site, app="demo", workdir="demo/1")
        case "job.awaiting_parents":
            return ParentsData(parent_ids=(PARENT_ID,))
        case "job.leased" | "job.lease_released" | "job.lease_expired" | "job.placement_refused":
            return LeaseData(session_id=session)
        case "job.started":
            return StartedData(session_id=session, skipped=skipped)
        case "job.run_done" | "job.run_errored" | "job.run_timed_out":
            return RunResultData(return_code=0 if event_type == "job.run_done" else 1)
        case "job.restart_ready":
            return RetryData(attempt=2)
        case "job.failed":
            return FailureData(reason="test")
        case "job.killed" | "job.reset":
            return ReasonData(reason="test")
        case "job.finished":
            run = RunResultData(return_code=0) if "job.run_done" in skipped else None
            return FinishedData(skipped=skipped, run=run)
        case _:
            return StepData(skipped=skipped)


def job_event(
    event_type: str,
    *,
    site: str = SITE,
    job_id: uuid.UUID = JOB_ID,
    session: uuid.UUID = HOLDER,
    skipped: tuple[str, ...] = (),
    spec_site: str | None = None,
) -> Event:
    data = job_data(event_type, site=spec_site or site, session=session, skipped=skipped)
    return EVENT_CLASSES[event_type].create(
        site=site, aggregate_id=job_id, actor="controller:test", data=data, occurred_at=AT
    )


def view_in(state: JobState, *, leased: bool = False) -> JobView:
    return JobView(
        id=JOB_ID,
        site=SITE,
        state=state,
        last_seq=LAST_SEQ,
        lease_seq=LEASE_SEQ if leased else None,
        lease_session=HOLDER if leased else None,
        attempts=1,
        stage_times={state.value: ENTERED},
    )


# --- the exhaustive table test ------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    event_type: str
    state: JobState | None
    leased: bool

    @property
    def id(self) -> str:
        where = self.state.value if self.state else "no-job"
        return f"{self.event_type}-{where}-{'leased' if self.leased else 'free'}"


CASES = [
    Case(event_type, state, leased)
    for event_type in TRANSITIONS
    for state in (None, *JobState)
    for leased in (False, True)
    if not (state is None and leased)  # a job that does not exist holds no lease
]


def allowed(transition: Transition, state: JobState | None, leased: bool) -> bool:
    """The table's verdict, read from the data and the LeaseEffect documentation."""
    if state not in transition.sources:
        return False
    if transition.lease == "acquire":
        return not leased
    if transition.lease in ("release", "require"):
        return leased
    return True


def test_cases_cover_every_job_event_class() -> None:
    assert set(TRANSITIONS) == {cls.event_type for cls in JOB_EVENTS}  # type: ignore[attr-defined]
    assert len(CASES) == len(TRANSITIONS) * (1 + 2 * len(JobState))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_transition_table_is_enforced(case: Case) -> None:
    transition = TRANSITIONS[case.event_type]
    view = None if case.state is None else view_in(case.state, leased=case.leased)
    event = job_event(case.event_type)

    if not allowed(transition, case.state, case.leased):
        with pytest.raises(IllegalTransition):
            apply(view, event, SEQ)
        return

    after = apply(view, event, SEQ)
    target = transition.target or case.state
    assert after.state == target
    assert after.last_seq == SEQ
    assert (after.id, after.site) == (JOB_ID, SITE)
    assert after.updated_at == AT
    if after.state != case.state:  # entering a state stamps it; lease events leave it alone
        assert after.stage_times[after.state.value] == AT
    else:
        assert after.stage_times == view_in(case.state, leased=case.leased).stage_times

    held_before = (LEASE_SEQ, HOLDER) if case.leased else (None, None)
    expected_lease = {
        "acquire": (SEQ, HOLDER),  # the lease is the sequence of the event that took it
        "release": (None, None),
        "end": (None, None),
        "require": held_before,
        "none": held_before,
    }[transition.lease]
    assert (after.lease_seq, after.lease_session) == expected_lease

    attempts_before = 0 if view is None else view.attempts
    started = case.event_type == "job.started"
    assert after.attempts == attempts_before + (1 if started else 0)


# --- skipped steps -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "event_type", "skipped", "target"),
    [
        # the controller's one event from CREATED to runnable: no parents, stage-in or hook
        (
            JobState.CREATED,
            "job.preprocessed",
            ("job.ready", "job.staged_in"),
            JobState.PREPROCESSED,
        ),
        (
            JobState.AWAITING_PARENTS,
            "job.preprocessed",
            ("job.ready", "job.staged_in"),
            JobState.PREPROCESSED,
        ),
        (JobState.CREATED, "job.staged_in", ("job.ready",), JobState.STAGED_IN),
        (JobState.READY, "job.preprocessed", ("job.staged_in",), JobState.PREPROCESSED),
        # a launcher that starts a job at once takes the lease with job.started itself
        (JobState.PREPROCESSED, "job.started", ("job.leased",), JobState.RUNNING),
        (JobState.RESTART_READY, "job.started", ("job.leased",), JobState.RUNNING),
        # no postprocess hook and no stage-out: finished straight from RUN_DONE
        (
            JobState.RUN_DONE,
            "job.finished",
            ("job.postprocessed", "job.staged_out"),
            JobState.JOB_FINISHED,
        ),
        (JobState.RUN_DONE, "job.staged_out", ("job.postprocessed",), JobState.STAGED_OUT),
        (JobState.POSTPROCESSED, "job.finished", ("job.staged_out",), JobState.JOB_FINISHED),
        # the lease holder finishes a run nothing follows: the event carries the run's result
        (
            JobState.RUNNING,
            "job.finished",
            ("job.run_done", "job.postprocessed", "job.staged_out"),
            JobState.JOB_FINISHED,
        ),
    ],
)
def test_valid_skip_paths_are_accepted(
    state: JobState, event_type: str, skipped: tuple[str, ...], target: JobState
) -> None:
    after = apply(view_in(state), job_event(event_type, skipped=skipped), SEQ)
    assert after.state == target
    if "job.leased" in skipped:
        assert (after.lease_seq, after.lease_session) == (SEQ, HOLDER)
    else:
        assert (after.lease_seq, after.lease_session) == (None, None)


@pytest.mark.parametrize(
    ("state", "event_type", "skipped"),
    [
        (JobState.RUNNING, "job.finished", ("job.run_errored", "job.postprocessed")),
        (JobState.CREATED, "job.ready", ("job.awaiting_parents",)),
        (JobState.RUN_ERROR, "job.started", ("job.restart_ready", "job.leased")),
        (JobState.STAGED_IN, "job.preprocessed", ("job.killed",)),
        (JobState.READY, "job.staged_in", ("job.no_such_step",)),
    ],
)
def test_non_skippable_step_is_refused(
    state: JobState, event_type: str, skipped: tuple[str, ...]
) -> None:
    not_skippable = next(step for step in skipped if step not in SKIPPABLE)
    with pytest.raises(IllegalTransition, match=f"{not_skippable} cannot be skipped"):
        apply(view_in(state), job_event(event_type, skipped=skipped), SEQ)


@pytest.mark.parametrize(
    ("state", "leased", "event_type", "skipped"),
    [
        (JobState.CREATED, False, "job.preprocessed", ("job.staged_in",)),  # a step left out
        (JobState.CREATED, False, "job.preprocessed", ("job.staged_in", "job.ready")),  # order
        (JobState.READY, False, "job.preprocessed", ("job.ready", "job.staged_in")),  # done already
        (JobState.RUN_DONE, False, "job.finished", ("job.staged_out",)),
        (JobState.RUN_DONE, False, "job.finished", ("job.postprocessed", "job.staged_out") * 2),
        (JobState.CREATED, False, "job.staged_in", ("job.ready", "job.staged_in")),  # overshoots
        (JobState.STAGED_IN, False, "job.started", ("job.leased",)),  # not runnable yet
        (JobState.PREPROCESSED, True, "job.started", ("job.leased",)),  # already leased
        (JobState.RUNNING, False, "job.started", ("job.leased",)),
        (JobState.PREPROCESSED, True, "job.finished", FINISHED_AT_RUN_END),  # never started
        (JobState.RUN_DONE, False, "job.finished", FINISHED_AT_RUN_END),  # the run is reported
    ],
)
def test_skip_with_illegal_chain_is_refused(
    state: JobState, leased: bool, event_type: str, skipped: tuple[str, ...]
) -> None:
    view = view_in(state, leased=leased)
    with pytest.raises(IllegalTransition, match=r"not allowed|already leased"):
        apply(view, job_event(event_type, skipped=skipped), SEQ)


def test_run_done_is_skipped_only_by_a_finish_that_carries_the_run() -> None:
    running = view_in(JobState.RUNNING, leased=True)
    without_result = JobFinished.create(
        site=SITE, aggregate_id=JOB_ID, actor="controller:test", occurred_at=AT,
        data=FinishedData(skipped=FINISHED_AT_RUN_END),
    )  # fmt: skip
    with pytest.raises(IllegalTransition, match="without the run's result"):
        apply(running, without_result, SEQ)
    # another event type may not stand for the run either, even with a result-shaped payload
    staged_out = job_event("job.staged_out", skipped=("job.run_done", "job.postprocessed"))
    with pytest.raises(IllegalTransition, match="without the run's result"):
        apply(running, staged_out, SEQ)


def test_finish_at_the_run_end_ends_the_lease_and_keeps_the_result() -> None:
    finished = job_event("job.finished", skipped=FINISHED_AT_RUN_END)
    after = apply(view_in(JobState.RUNNING, leased=True), finished, SEQ)
    assert after.state == JobState.JOB_FINISHED
    assert (after.lease_seq, after.lease_session) == (None, None)
    assert isinstance(finished.data, FinishedData)
    assert finished.data.run is not None
    assert finished.data.run.return_code == 0


# --- fencing, identity and ordering --------------------------------------------------------


@pytest.mark.parametrize("state", sorted(RUNNABLE))
def test_started_by_another_session_than_the_lease_holder_is_refused(state: JobState) -> None:
    zombie = job_event("job.started", session=OTHER_SESSION)
    with pytest.raises(IllegalTransition, match="lease is held by"):
        apply(view_in(state, leased=True), zombie, SEQ)
    # the holder itself is fine
    assert apply(view_in(state, leased=True), job_event("job.started"), SEQ).state == (
        JobState.RUNNING
    )


@pytest.mark.parametrize("event_type", ["job.lease_released", "job.lease_expired"])
def test_release_naming_another_session_than_the_holder_is_refused(event_type: str) -> None:
    view = view_in(JobState.PREPROCESSED, leased=True)
    with pytest.raises(IllegalTransition, match="lease is held by"):
        apply(view, job_event(event_type, session=OTHER_SESSION), SEQ)


def test_created_for_a_site_other_than_its_spec_is_refused() -> None:
    with pytest.raises(IllegalTransition, match="names site 'beta'"):
        apply(None, job_event("job.created", spec_site="beta"), 1)


@pytest.mark.parametrize(
    ("site", "job_id"),
    [("beta", JOB_ID), (SITE, PARENT_ID), ("beta", PARENT_ID)],
    ids=["other-site", "other-job", "both"],
)
def test_event_for_another_job_is_refused(site: str, job_id: uuid.UUID) -> None:
    with pytest.raises(IllegalTransition, match="does not match"):
        apply(view_in(JobState.CREATED), job_event("job.ready", site=site, job_id=job_id), SEQ)


@pytest.mark.parametrize("seq", [LAST_SEQ, LAST_SEQ - 1, 0])
def test_non_increasing_sequence_is_refused(seq: int) -> None:
    with pytest.raises(IllegalTransition, match="is not after"):
        apply(view_in(JobState.CREATED), job_event("job.ready"), seq)


def test_non_job_event_is_refused() -> None:
    queued = BatchJobQueued.create(site=SITE, aggregate_id=JOB_ID, actor="site:alpha")
    with pytest.raises(IllegalTransition, match="not a job event"):
        apply(view_in(JobState.CREATED), queued, SEQ)


# --- whole histories -----------------------------------------------------------------------


def test_common_path_folds_in_five_events() -> None:
    history = [
        job_event("job.created"),
        job_event("job.preprocessed", skipped=("job.ready", "job.staged_in")),
        job_event("job.started", skipped=("job.leased",)),
        job_event("job.run_done"),
        job_event("job.finished", skipped=("job.postprocessed", "job.staged_out")),
    ]
    view = fold(enumerate(history, start=1))
    assert view is not None
    assert view.state == JobState.JOB_FINISHED
    assert (view.lease_seq, view.lease_session, view.attempts, view.last_seq) == (None, None, 1, 5)


def test_common_path_of_a_job_nothing_follows_folds_in_four_events() -> None:
    history = [
        job_event("job.created"),
        job_event("job.preprocessed", skipped=("job.ready", "job.staged_in")),
        job_event("job.started", skipped=("job.leased",)),
        job_event("job.finished", skipped=FINISHED_AT_RUN_END),
    ]
    view = fold(enumerate(history, start=1))
    assert view is not None
    assert view.state == JobState.JOB_FINISHED
    assert (view.lease_seq, view.lease_session, view.attempts, view.last_seq) == (None, None, 1, 4)


def test_retry_kill_and_reset_path_folds() -> None:
    steps = [
        ("job.created", JobState.CREATED),
        ("job.awaiting_parents", JobState.AWAITING_PARENTS),
        ("job.ready", JobState.READY),
        ("job.staged_in", JobState.STAGED_IN),
        ("job.preprocessed", JobState.PREPROCESSED),
        ("job.leased", JobState.PREPROCESSED),
        ("job.lease_expired", JobState.PREPROCESSED),
        ("job.leased", JobState.PREPROCESSED),
        ("job.started", JobState.RUNNING),
        ("job.run_errored", JobState.RUN_ERROR),
        ("job.restart_ready", JobState.RESTART_READY),
        ("job.leased", JobState.RESTART_READY),
        ("job.killed", JobState.KILLED),
        ("job.reset", JobState.READY),
    ]
    view: JobView | None = None
    for seq, (event_type, state) in enumerate(steps, start=1):
        view = apply(view, job_event(event_type), seq)
        assert view.state == state, event_type
    assert view is not None
    assert view.lease_seq is None  # the kill ended the lease taken at sequence 12
    assert view.attempts == 1


# --- properties of the table itself --------------------------------------------------------


def test_every_state_is_reachable_from_created() -> None:
    reachable = {JobState.CREATED}
    queue = deque([JobState.CREATED])
    while queue:
        state = queue.popleft()
        for transition in TRANSITIONS.values():
            target = transition.target or state
            if state in transition.sources and target not in reachable:
                reachable.add(target)
                queue.append(target)
    assert reachable == set(JobState)


@pytest.mark.parametrize("state", sorted(FINAL))
def test_final_states_only_leave_by_reset(state: JobState) -> None:
    outgoing = {name for name, t in TRANSITIONS.items() if state in t.sources}
    expected = set() if state == JobState.JOB_FINISHED else {"job.reset"}
    assert outgoing == expected


def test_skippable_steps_and_runnable_states_are_in_the_table() -> None:
    assert set(SKIPPABLE) <= set(TRANSITIONS)
    # a skipped step may take the lease (job.leased) or end it with the run (job.run_done)
    assert all(TRANSITIONS[name].lease in ("none", "acquire", "end") for name in SKIPPABLE)
    assert {TRANSITIONS["job.preprocessed"].target, TRANSITIONS["job.restart_ready"].target} == (
        set(RUNNABLE)
    )
