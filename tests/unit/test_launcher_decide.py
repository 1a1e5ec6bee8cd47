"""The pilot's decisions (``agents/launcher/decide.py``), without NATS or processes.

Each outcome is also folded by the state machine (``schemas/fold.py``) from the state the
pilot reports it in: a decision that chose an event the log's readers would quarantine
fails here, not in a pilot.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lodestream.agents.launcher import decide
from lodestream.agents.launcher.decide import (
    TAIL_CHARS,
    AfterStart,
    Offer,
    Outcome,
    Redelivery,
    RunEnd,
)
from lodestream.agents.launcher.report import ExitReason, LauncherReport, Tally
from lodestream.agents.launcher.work import WorkItem
from lodestream.agents.site.settings import JobMode
from lodestream.platform_adapters.compute.base import NodePlacement
from lodestream.platform_adapters.packing import Allocation, JobRequest
from lodestream.schemas.events import (
    JobFinished,
    JobRunDone,
    JobRunErrored,
    JobRunTimedOut,
    JobStarted,
)
from lodestream.schemas.events.job import CreatedData, FinishedData, Placement, RunResultData
from lodestream.schemas.fold import JobView, apply
from lodestream.schemas.placement import SiteChoice, SiteFigures
from lodestream.schemas.resources import App, AppTransferSlot, JobSpec, TransferSpec
from lodestream.schemas.states import FINISHED_AT_RUN_END, RUNNABLE, JobState

SITE = "alpha"
JOB_ID = uuid.UUID("01900000-0000-7000-8000-000000000001")
SESSION = uuid.UUID("01900000-0000-7000-8000-0000000000a1")
AT = datetime(2025, 1, 2, tzinfo=UTC)
LEASE_SEQ = 12
SPEC = JobSpec(site=SITE, app="demo", workdir="demo/1")
ALLOCATION = Allocation(
    "j", (NodePlacement("n1", (0, 1), ("0", "MIG-a")), NodePlacement("n2", (4,)))
)


def item(spec: JobSpec = SPEC, *, seq: int = 10, attempt: int = 1) -> WorkItem:
    return WorkItem(site=SITE, job_id=JOB_ID, seq=seq, spec=spec, attempt=attempt, msg=None)


def app(*, hooks: tuple[str, ...] = (), out_slot: bool = False) -> App:
    transfers = {"results": AppTransferSlot(direction="out", local_path="out")} if out_slot else {}
    return App(site=SITE, name="demo", hooks=hooks, transfers=transfers)


def end(code: int = 0, *, tail: str = "", pyrun: str | None = None) -> RunEnd:
    return RunEnd(return_code=code, runtime_s=1.5, stderr_tail=tail, pyrun_result=pyrun)


def running() -> JobView:
    """The job as the pilot holds it while its task runs: RUNNING on our lease."""
    return JobView(
        id=JOB_ID,
        site=SITE,
        state=JobState.RUNNING,
        last_seq=LEASE_SEQ,
        lease_seq=LEASE_SEQ,
        lease_session=SESSION,
        attempts=1,
    )


def fold_outcome(outcome: Outcome, view: JobView) -> JobView:
    event = outcome.kind.create(
        site=SITE,
        aggregate_id=JOB_ID,
        actor=f"launcher:{SESSION}",
        data=outcome.data,
        occurred_at=AT,
    )
    return apply(view, event, view.last_seq + 1)


# --- deliveries ---------------------------------------------------------------------------


def test_a_job_that_can_never_fit_is_left_to_another_pilot() -> None:
    refused = decide.Refusal("needs 4 nodes")
    assert decide.offer(SPEC, refused=refused, remaining_min=60) is Offer.NEVER_FITS


def test_a_job_no_pilot_of_the_site_can_run_is_failed_here() -> None:
    refused = decide.Refusal("needs 4 nodes; no pilot of this site can run it", nowhere=True)
    assert decide.offer(SPEC, refused=refused, remaining_min=60) is Offer.NOWHERE


def test_a_job_longer_than_the_pilot_has_left_is_left_to_another_pilot() -> None:
    spec = SPEC.model_copy(update={"wall_time_min": 30})
    assert decide.offer(spec, refused=None, remaining_min=29.5) is Offer.OUT_OF_TIME
    assert decide.offer(spec, refused=None, remaining_min=30) is Offer.PLACE


@given(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False))
def test_a_job_without_a_wall_time_is_placed_whatever_time_remains(remaining: float) -> None:
    assert decide.offer(SPEC, refused=None, remaining_min=remaining) is Offer.PLACE


@given(
    wall=st.integers(0, 60 * 24 * 30),
    remaining=st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    never=st.none() | st.builds(decide.Refusal, st.text(max_size=5), st.booleans()),
)
def test_offer_places_exactly_what_fits_and_has_time(
    wall: int, remaining: float, never: decide.Refusal | None
) -> None:
    spec = SPEC.model_copy(update={"wall_time_min": wall})
    verdict = decide.offer(spec, refused=never, remaining_min=remaining)
    fits_in_time = never is None and (wall == 0 or wall <= remaining)
    assert (verdict is Offer.PLACE) == fits_in_time
    if never is not None:  # the refusal comes first
        assert verdict is (Offer.NOWHERE if never.nowhere else Offer.NEVER_FITS)


LOCAL_SITE = decide.SiteShape(same_nodes=True, same_node_shape=True, described="machine local")
DESCRIBED = decide.SiteShape(same_node_shape=True, described="machine polaris's nodes")
SIZED_BY_ALLOCATION = decide.SiteShape()


def request(**resources: int) -> JobRequest:
    return JobRequest("j", **resources)


@pytest.mark.parametrize("mode", ["serial", "mpi"])
def test_a_job_that_fits_is_not_refused(mode: JobMode) -> None:
    assert decide.refusal(request(), mode=mode, never_fits=None, pilot_nodes=2,
                          site=LOCAL_SITE) is None  # fmt: skip


@pytest.mark.parametrize(
    ("site", "nowhere"), [(LOCAL_SITE, True), (DESCRIBED, False), (SIZED_BY_ALLOCATION, False)]
)
def test_more_nodes_than_the_pilot_has_is_nowhere_only_when_every_pilot_has_these(
    site: decide.SiteShape, nowhere: bool
) -> None:
    refused = decide.refusal(request(num_nodes=3), mode="mpi", never_fits="needs 3 nodes",
                             pilot_nodes=2, site=site)  # fmt: skip
    assert refused is not None
    assert refused.nowhere is nowhere
    assert refused.reason.startswith("needs 3 nodes")
    if nowhere:
        assert "no pilot of this site can run it (machine local)" in refused.reason


@pytest.mark.parametrize(
    ("site", "nowhere"), [(LOCAL_SITE, True), (DESCRIBED, True), (SIZED_BY_ALLOCATION, False)]
)
def test_nodes_too_small_is_nowhere_when_every_node_of_the_site_has_this_shape(
    site: decide.SiteShape, nowhere: bool
) -> None:
    refused = decide.refusal(request(ranks_per_node=64), mode="mpi", pilot_nodes=2, site=site,
                             never_fits="needs 64 cpus and 0 gpus on one node")  # fmt: skip
    assert refused is not None
    assert refused.nowhere is nowhere


@pytest.mark.parametrize("resources", [{"num_nodes": 2}, {"ranks_per_node": 2}])
def test_a_serial_pilot_leaves_mpi_jobs_to_an_mpi_pilot(resources: dict[str, int]) -> None:
    job = request(**resources)
    refused = decide.refusal(job, mode="serial", never_fits=None, pilot_nodes=4, site=LOCAL_SITE)
    assert refused is not None
    assert not refused.nowhere  # a pilot of the site in mpi mode takes it
    assert "mpi mode" in refused.reason
    assert decide.refusal(job, mode="mpi", never_fits=None, pilot_nodes=4,
                          site=LOCAL_SITE) is None  # fmt: skip


def test_a_serial_pilot_runs_single_rank_jobs_of_many_threads() -> None:
    job = request(threads_per_rank=4, node_packing_count=2)
    assert decide.refusal(job, mode="serial", never_fits=None, pilot_nodes=1,
                          site=SIZED_BY_ALLOCATION) is None  # fmt: skip


@pytest.mark.parametrize(
    ("seq", "expected"),
    [
        (10, Redelivery.LEASING),
        (9, Redelivery.STALE),
        (1, Redelivery.STALE),
        (11, Redelivery.NEWER),
    ],
)
def test_a_second_delivery_of_a_held_job(seq: int, expected: Redelivery) -> None:
    assert decide.redelivery(seq, held_seq=10) is expected


@given(st.integers(1, 2**63), st.integers(1, 2**63))
def test_redelivery_follows_the_order_of_the_sequences(seq: int, held: int) -> None:
    verdict = decide.redelivery(seq, held)
    assert (verdict is Redelivery.LEASING) == (seq == held)
    assert (verdict is Redelivery.STALE) == (seq < held)
    assert (verdict is Redelivery.NEWER) == (seq > held)


# --- the tag filter ---------------------------------------------------------------------

TAG_KEYS = st.sampled_from(["beam", "run", "campaign:a", "x"])
TAG_VALUES = st.sampled_from(["A", "B", "", "7", "a b"])


def handed_back(tags: dict[str, str], wanted: dict[str, str], **kw: Any) -> decide.HandBack | None:
    defaults = {"deliveries": 1, "idle_ttl_s": 60.0, "jitter": 0.0}
    return decide.outside_filter(tags, wanted, **(defaults | kw))


def test_a_pilot_without_a_filter_takes_every_job() -> None:
    assert handed_back({}, {}) is None
    assert handed_back({"beam": "B"}, {}) is None


@pytest.mark.parametrize(
    "tags",
    [{"beam": "A"}, {"beam": "A", "run": "7"}],  # every pair of the filter; more is fine
)
def test_a_job_carrying_the_filters_tags_is_taken(tags: dict[str, str]) -> None:
    assert handed_back(tags, {"beam": "A"}) is None


@pytest.mark.parametrize(
    ("tags", "missing"),
    [
        ({}, "beam=A, run=7"),
        ({"beam": "B", "run": "7"}, "beam=A"),
        ({"beam": "AB", "run": "7"}, "beam=A"),  # values are compared whole
        ({"beam": "a", "run": "7"}, "beam=A"),  # and exactly
        ({"beam": "A"}, "run=7"),  # every pair, not any
        ({"Beam": "A", "run": "7"}, "beam=A"),
    ],
)  # fmt: skip
def test_a_job_without_all_of_the_filters_tags_is_handed_back(
    tags: dict[str, str], missing: str
) -> None:
    back = handed_back(tags, {"beam": "A", "run": "7"})
    assert back is not None
    assert back.reason == f"its tags lack {missing}"


@given(
    tags=st.dictionaries(TAG_KEYS, TAG_VALUES),
    wanted=st.dictionaries(TAG_KEYS, TAG_VALUES),
    deliveries=st.integers(1, 10_000),
    jitter=st.floats(0.0, 1.0, exclude_max=True),
)
def test_a_job_is_handed_back_exactly_when_a_pair_of_the_filter_is_not_among_its_tags(
    tags: dict[str, str], wanted: dict[str, str], deliveries: int, jitter: float
) -> None:
    back = handed_back(tags, wanted, deliveries=deliveries, jitter=jitter)
    assert (back is None) == (wanted.items() <= tags.items())
    if back is not None:
        assert decide.HAND_BACK_FIRST_S / 2 <= back.delay_s <= decide.HAND_BACK_MAX_S


def test_the_hand_back_delay_doubles_with_the_deliveries_up_to_its_cap() -> None:
    delays = [handed_back({}, {"beam": "A"}, deliveries=n) for n in range(1, 8)]
    assert [d.delay_s for d in delays if d is not None] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]


def test_jitter_takes_up_to_half_of_the_delay_off() -> None:
    # Whole multiples of the pilots' fetch wait would bring a job back to the same pilot.
    delays = [handed_back({}, {"beam": "A"}, deliveries=3, jitter=j) for j in (0.0, 0.5, 0.99)]
    assert [d.delay_s for d in delays if d is not None] == [2.0, 1.5, pytest.approx(1.01)]


@pytest.mark.parametrize(("idle_ttl_s", "cap"), [(600.0, 5.0), (24.0, 2.0), (1.0, 0.5)])
def test_a_handed_back_job_comes_back_often_within_the_sites_idle_ttl(
    idle_ttl_s: float, cap: float
) -> None:
    # A pilot that wants it gets a dozen chances at it before it idles out.
    back = handed_back({}, {"beam": "A"}, deliveries=100, idle_ttl_s=idle_ttl_s)
    assert back is not None
    assert back.delay_s == cap


def test_a_retry_not_due_yet_is_handed_back_until_it_is() -> None:
    back = handed_back({}, {"beam": "A"}, not_due_s=90.0)
    assert back is not None
    assert back.delay_s == 90.0
    assert handed_back({"beam": "A"}, {"beam": "A"}, not_due_s=90.0) is None  # ours: deferred


def test_work_that_was_never_created_is_not_run() -> None:
    assert decide.not_as_submitted(None, SPEC) == "no job.created on the log"


def test_work_as_submitted_is_run() -> None:
    assert decide.not_as_submitted(SPEC.model_copy(), SPEC) is None


@pytest.mark.parametrize(
    "change",
    [
        {"app": "other"},
        {"workdir": "elsewhere"},
        {"parameters": {"x": "1"}},
        {"num_nodes": 2},
        {"data": {"k": [1]}},
        {"tags": {"t": "v"}},
    ],
)
def test_work_that_differs_from_the_submission_is_not_run(change: dict[str, Any]) -> None:
    forged = SPEC.model_copy(update=change)
    assert decide.not_as_submitted(SPEC, forged) == "its work differs from the job as submitted"


# --- starting -----------------------------------------------------------------------------


def test_the_lease_is_job_started_itself_with_placement_and_attempt() -> None:
    data = decide.lease(item(attempt=3), SESSION, ALLOCATION)
    assert data.skipped == ("job.leased",)
    assert data.session_id == SESSION
    assert data.attempt == 3
    # GPU ids that are not device indices (MIG UUIDs) cannot be recorded as numbers.
    assert data.placement == (
        Placement(hostname="n1", cores=(0, 1), gpus=(0,)),
        Placement(hostname="n2", cores=(4,), gpus=()),
    )


@pytest.mark.parametrize("state", sorted(RUNNABLE))
def test_the_lease_starts_a_runnable_job_in_one_event(state: JobState) -> None:
    view = JobView(id=JOB_ID, site=SITE, state=state, last_seq=LEASE_SEQ - 1)
    data = decide.lease(item(), SESSION, ALLOCATION)
    started = JobStarted.create(
        site=SITE, aggregate_id=JOB_ID, actor=f"launcher:{SESSION}", data=data, occurred_at=AT
    )
    after = apply(view, started, LEASE_SEQ)
    assert (after.state, after.lease_seq, after.lease_session) == (
        JobState.RUNNING,
        LEASE_SEQ,
        SESSION,
    )


@pytest.mark.parametrize(
    ("lost", "draining", "expected"),
    [
        (False, False, AfterStart.RUN),
        (False, True, AfterStart.STOP),
        (True, False, AfterStart.KILL),
        (True, True, AfterStart.KILL),
    ],
)
def test_what_a_task_that_just_came_up_does(
    *, lost: bool, draining: bool, expected: AfterStart
) -> None:
    assert decide.after_start(lost=lost, draining=draining) is expected


# --- results ------------------------------------------------------------------------------


def test_a_failed_run_is_reported_as_errored_with_its_stderr() -> None:
    outcome = decide.run_result(item(attempt=2), end(3, tail="boom"), app())
    assert (outcome.kind, outcome.tally) == (JobRunErrored, Tally.ERRORED)
    assert outcome.data == RunResultData(
        return_code=3, stderr_tail="boom", runtime_s=1.5, work=SPEC, attempt=2
    )
    assert fold_outcome(outcome, running()).state is JobState.RUN_ERROR


def test_a_run_that_nothing_follows_finishes_the_job_with_its_result() -> None:
    outcome = decide.run_result(item(), end(0), app(hooks=("preprocess", "handle_error")))
    assert (outcome.kind, outcome.tally) == (JobFinished, Tally.FINISHED)
    assert isinstance(outcome.data, FinishedData)
    assert outcome.data.skipped == FINISHED_AT_RUN_END
    assert outcome.data.run == RunResultData(return_code=0, runtime_s=1.5)
    after = fold_outcome(outcome, running())
    assert (after.state, after.lease_seq) == (JobState.JOB_FINISHED, None)


@pytest.mark.parametrize(
    "model",
    [app(hooks=("postprocess",)), app(out_slot=True), None],
    ids=["postprocess-hook", "stage-out", "app-unknown-here"],
)
def test_a_run_that_steps_follow_is_reported_as_run_done(model: App | None) -> None:
    spec = SPEC.model_copy(
        update={"transfers": {"results": TransferSpec(location="globus:x", path="/r")}}
    )
    outcome = decide.run_result(item(spec), end(0), model)
    assert (outcome.kind, outcome.tally) == (JobRunDone, Tally.FINISHED)
    assert outcome.data == RunResultData(return_code=0, runtime_s=1.5, work=spec)
    assert fold_outcome(outcome, running()).state is JobState.RUN_DONE


def test_a_python_apps_result_is_reported() -> None:
    pyrun = json.dumps({"ok": True, "result": {"answer": 42}})
    outcome = decide.run_result(item(), end(0, pyrun=pyrun), app())
    assert isinstance(outcome.data, FinishedData)
    assert outcome.data.run is not None
    assert outcome.data.run.result == {"answer": 42}


@pytest.mark.parametrize(
    ("doc", "tail"),
    [
        ({"ok": False, "error": "ValueError: x", "traceback": "Traceback ..."}, "Traceback ..."),
        ({"ok": False, "error": "ValueError: x"}, "ValueError: x"),
        ({"ok": False}, "stderr"),
    ],
)
def test_a_python_apps_exception_replaces_its_stderr(doc: dict[str, Any], tail: str) -> None:
    outcome = decide.run_result(item(), end(1, tail="stderr", pyrun=json.dumps(doc)), app())
    assert outcome.kind is JobRunErrored
    assert isinstance(outcome.data, RunResultData)
    assert (outcome.data.stderr_tail, outcome.data.result) == (tail, None)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[1]", "its result file is not pyrun's: not a pyrun result"),
        ("{not json", "its result file is not pyrun's: Expecting property name"),
        ("<unreadable: Is a directory>", "its result file is not pyrun's"),
        ('{"ok": true, "result": "a\\u0000b"}', "its result cannot be stored"),
    ],
)
def test_a_result_file_pyrun_did_not_write_makes_the_run_an_error(text: str, why: str) -> None:
    # The job can overwrite the file; its pilot must still report the job, with the reason.
    outcome = decide.run_result(item(), end(0, tail="", pyrun=text), app())
    assert outcome.kind is JobRunErrored
    assert outcome.tally is Tally.ERRORED
    assert isinstance(outcome.data, RunResultData)
    assert outcome.data.cause[0].startswith(why)
    assert fold_outcome(outcome, running()).state is JobState.RUN_ERROR


@given(
    code=st.integers(-(2**31), 2**31 - 1),
    tail=st.text(max_size=3 * TAIL_CHARS),
    hooks=st.sets(st.sampled_from(["preprocess", "postprocess", "handle_error"])),
    known=st.booleans(),
)
def test_every_run_result_is_legal_from_running_and_keeps_the_tail_end(
    code: int, tail: str, hooks: set[str], *, known: bool
) -> None:
    model = app(hooks=tuple(sorted(hooks))) if known else None
    outcome = decide.run_result(item(), end(code, tail=tail), model)
    run = outcome.data.run if isinstance(outcome.data, FinishedData) else outcome.data
    assert isinstance(run, RunResultData)
    assert run.return_code == code
    assert tail.endswith(run.stderr_tail)
    assert len(run.stderr_tail) == min(len(tail), TAIL_CHARS)
    assert (outcome.tally is Tally.ERRORED) == (code != 0)
    after = fold_outcome(outcome, running())
    assert after.state in {JobState.RUN_ERROR, JobState.RUN_DONE, JobState.JOB_FINISHED}


@given(st.text(max_size=3 * TAIL_CHARS))
def test_a_task_that_could_not_start_is_an_error_with_the_reason(reason: str) -> None:
    outcome = decide.start_failure(item(attempt=2), reason)
    assert (outcome.kind, outcome.tally) == (JobRunErrored, Tally.ERRORED)
    assert isinstance(outcome.data, RunResultData)
    assert outcome.data.return_code is None
    assert outcome.data.cause == ("task could not start",)
    assert outcome.data.stderr_tail == reason[-TAIL_CHARS:]
    assert (outcome.data.work, outcome.data.attempt) == (SPEC, 2)
    assert fold_outcome(outcome, running()).state is JobState.RUN_ERROR


def test_a_job_no_pilot_can_run_is_an_error_of_the_site_with_the_reason() -> None:
    why = "needs 3 nodes; this pilot has 2; no pilot of this site can run it (machine local)"
    outcome = decide.unrunnable(item(), why)
    assert (outcome.kind, outcome.tally) == (JobRunErrored, Tally.ERRORED)
    assert isinstance(outcome.data, RunResultData)
    assert outcome.data.cause == ("cannot run at this site",)
    assert outcome.data.stderr_tail == why
    assert fold_outcome(outcome, running()).state is JobState.RUN_ERROR


@pytest.mark.parametrize("code", [0, 1, -9])
def test_a_task_whose_runner_was_lost_timed_out_whatever_its_status(code: int) -> None:
    lost = "worker rank 2 (node n2) lost: silent for 30 s"
    ended = RunEnd(return_code=code, runtime_s=4.0, stderr_tail="ignored", pyrun_result="{}",
                   lost=lost)  # fmt: skip
    outcome = decide.run_result(item(attempt=3), ended, app())
    assert (outcome.kind, outcome.tally) == (JobRunTimedOut, Tally.TIMED_OUT)
    assert outcome.data == RunResultData(cause=(lost,), runtime_s=4.0, work=SPEC, attempt=3)
    assert fold_outcome(outcome, running()).state is JobState.RUN_TIMEOUT


@pytest.mark.parametrize("code", [None, -15, 0])
def test_a_drained_task_timed_out_with_the_launchers_reason(code: int | None) -> None:
    outcome = decide.drained(item(attempt=2), SESSION, ExitReason.WALL_TIME, code)
    assert (outcome.kind, outcome.tally) == (JobRunTimedOut, Tally.TIMED_OUT)
    assert outcome.data == RunResultData(
        return_code=code,
        cause=(f"launcher {SESSION} drained: wall time reached",),
        work=SPEC,
        attempt=2,
    )
    assert fold_outcome(outcome, running()).state is JobState.RUN_TIMEOUT


BATCH = uuid.UUID("01900000-0000-7000-8000-0000000000b1")


@pytest.mark.parametrize(
    ("reason", "remaining_s", "verdict"),
    [
        ("wall time reached", 0.0, "walltime_expired"),
        # SIGTERM in the last minute: the scheduler enforcing the wall time.
        ("stopped", 30.0, "walltime_expired"),
        ("stopped", 3600.0, "told to stop (deleted, preempted or shut down)"),
        ("idle", 3600.0, "its pilot exits (idle)"),
    ],
)
def test_a_pilot_in_a_batch_job_names_it_in_the_cause_chain(
    reason: str, remaining_s: float, verdict: str
) -> None:
    batch = decide.PilotBatch(BATCH, "slurm", "1234")
    outcome = decide.drained(item(), SESSION, ExitReason(reason), -15, batch=batch,
                             remaining_s=remaining_s)  # fmt: skip
    assert isinstance(outcome.data, RunResultData)
    assert outcome.data.cause == (
        f"launcher {SESSION} drained: {reason}",
        f"batch job {BATCH} (slurm 1234): {verdict}",
    )
    assert fold_outcome(outcome, running()).state is JobState.RUN_TIMEOUT


# --- a task that dies as its pilot is stopped ---------------------------------------------

STOP_AT = 1000.0


@pytest.mark.parametrize(
    ("code", "ended_at", "stopped_at", "by_stop"),
    [
        # scancel: srun's 143, Hydra's 255, a signal Python reports, SIGKILL after KillWait,
        # each a moment before the pilot's own SIGTERM
        (143, STOP_AT - 0.5, STOP_AT, True),
        (255, STOP_AT - 2.0, STOP_AT, True),
        (-15, STOP_AT - 0.1, STOP_AT, True),
        (137, STOP_AT - decide.STOP_WINDOW_S, STOP_AT, True),
        # or after it, whatever the code
        (143, STOP_AT + 0.2, STOP_AT, True),
        (1, STOP_AT + 0.2, STOP_AT, True),
        # a signal long before the stop is the task's own failure, and so is a plain error
        (143, STOP_AT - decide.STOP_WINDOW_S - 0.1, STOP_AT, False),
        (1, STOP_AT - 0.1, STOP_AT, False),
        (2, STOP_AT - 0.1, STOP_AT, False),
        # never stopped: a failure is a failure; a success is one, however late
        (143, STOP_AT, None, False),
        (0, STOP_AT + 1, STOP_AT, False),
    ],
)
def test_a_task_that_dies_as_its_pilot_is_stopped_died_of_the_stop(
    code: int, ended_at: float, stopped_at: float | None, by_stop: bool
) -> None:
    assert decide.ended_by_stop(code, ended_at=ended_at, stopped_at=stopped_at) is by_stop


@pytest.mark.parametrize("code", [-15, -9, 129, 130, 137, 143, 255])
def test_signal_deaths_are_told_from_failures(code: int) -> None:
    assert decide.signalled(code)
    assert not decide.signalled(code - 128 if code > 128 else 1)


def test_a_task_that_died_with_its_stopped_pilot_timed_out_with_the_cause_chain() -> None:
    batch = decide.PilotBatch(BATCH, "slurm", "1234")
    outcome = decide.ended_with_pilot(item(attempt=2), SESSION, 255, batch=batch,
                                      remaining_s=3600.0)  # fmt: skip
    assert (outcome.kind, outcome.tally) == (JobRunTimedOut, Tally.TIMED_OUT)
    assert outcome.data == RunResultData(
        return_code=255,
        cause=(
            "the task ended (return code 255) as its pilot was told to stop",
            f"launcher {SESSION} drained: stopped",
            f"batch job {BATCH} (slurm 1234): told to stop (deleted, preempted or shut down)",
        ),
        work=SPEC,
        attempt=2,
    )
    assert fold_outcome(outcome, running()).state is JobState.RUN_TIMEOUT
    # the scheduler's time limit, in the pilot's last minute
    late = decide.ended_with_pilot(item(), SESSION, 143, batch=batch, remaining_s=20.0)
    assert isinstance(late.data, RunResultData)
    assert late.data.cause[-1] == f"batch job {BATCH} (slurm 1234): walltime_expired"


def test_a_pilot_that_cannot_tell_its_scheduler_id_names_the_batch_job_alone() -> None:
    outcome = decide.drained(item(), SESSION, ExitReason.WALL_TIME, None,
                             batch=decide.PilotBatch(BATCH))  # fmt: skip
    assert isinstance(outcome.data, RunResultData)
    assert outcome.data.cause[-1] == f"batch job {BATCH}: walltime_expired"


def test_a_task_that_came_up_while_draining_timed_out() -> None:
    outcome = decide.late_start(item(attempt=2), SESSION)
    assert (outcome.kind, outcome.tally) == (JobRunTimedOut, Tally.TIMED_OUT)
    assert outcome.data == RunResultData(
        cause=(f"launcher {SESSION} was draining",), work=SPEC, attempt=2
    )
    assert fold_outcome(outcome, running()).state is JobState.RUN_TIMEOUT


@pytest.mark.parametrize("tally", list(Tally))
def test_each_tally_counts_in_its_own_field(tally: Tally) -> None:
    report = LauncherReport()
    report.count(tally)
    report.count(tally)
    assert getattr(report, tally.value) == 2
    assert sum(vars_of(report).values()) == 2


def vars_of(report: LauncherReport) -> dict[str, int]:
    return {name: getattr(report, name) for name in report.__slots__ if name != "exit_reason"}


def test_a_created_site_choice_is_not_a_difference_in_the_work() -> None:
    """``site: "auto"`` records its choice in job.created; the work handed on never has it."""
    figures = SiteFigures(backlog=0, throughput_per_s=1.0, eta_s=1.0)
    choice = SiteChoice(strategy="round_robin", chosen=SPEC.site, candidates={SPEC.site: figures})
    created = CreatedData.model_validate({**dict(SPEC), "site_choice": choice})
    assert decide.not_as_submitted(created, SPEC) is None
    assert decide.not_as_submitted(created, SPEC.model_copy(update={"app": "other"})) is not None
