"""The controller's part in data staging (``services/controller/staging.py``): the items it
requests for a step, and how a step ends — pure decisions, folded as the log would."""

from __future__ import annotations

import uuid

import pytest

from lodestream.schemas.events import (
    JobFailed,
    JobPostprocessed,
    JobReady,
    JobReset,
    JobStagedIn,
    JobStagedOut,
    TransferRequested,
    TransferSucceeded,
)
from lodestream.schemas.events.job import FailureData
from lodestream.schemas.events.xfer import TransferRequestedData
from lodestream.schemas.resources import (
    App,
    AppTransferSlot,
    JobSpec,
    TransferSpec,
    TransferState,
)
from lodestream.schemas.states import JobState
from lodestream.schemas.xfer import item_id
from lodestream.services.controller.decide import ACTOR
from lodestream.services.controller.staging import StepItem, StepView, request_items, settle_step
from tests.unit.test_controller_decide import SEQ, SITE, cause, folded, view_in

JOB = uuid.UUID("01900000-0000-7000-8000-000000000001")
APP = App(
    site=SITE, name="demo",
    transfers={
        "raw": AppTransferSlot(direction="in", local_path="in/raw.h5"),
        "calib": AppTransferSlot(direction="in", local_path="in/calib"),
        "result": AppTransferSlot(direction="out", local_path="out/result.h5"),
    },
)  # fmt: skip
SPEC = JobSpec(
    site=SITE, app="demo", workdir="runs/7",
    transfers={
        "raw": TransferSpec(location="dtn", path="/exp/raw.h5"),
        "calib": TransferSpec(location="dtn", path="/exp/calib", recursive=True),
        "result": TransferSpec(location="dtn", path="/exp/out/result.h5"),
    },
)  # fmt: skip


def test_a_ready_job_asks_for_one_item_per_input_slot() -> None:
    ready = cause(JobReady)
    appends = request_items(ready, JOB, SPEC, APP, "in")
    events = [a.event for a in appends]
    assert all(isinstance(e, TransferRequested) for e in events)
    assert all(a.expect == 0 for a in appends)  # new aggregates: nothing may precede them
    data = [e.data for e in events]
    assert all(isinstance(d, TransferRequestedData) for d in data)
    assert [(d.slot, d.direction, d.local_path, d.remote.path, d.remote.recursive, d.step_id)
            for d in data if isinstance(d, TransferRequestedData)] == [
        ("calib", "in", "runs/7/in/calib", "/exp/calib", True, ready.id),
        ("raw", "in", "runs/7/in/raw.h5", "/exp/raw.h5", False, ready.id),
    ]  # fmt: skip
    assert [e.aggregate_id for e in events] == [
        item_id(ready.id, JOB, "calib", "in"),
        item_id(ready.id, JOB, "raw", "in"),
    ]
    assert all(e.actor == ACTOR and e.causation_id == ready.id for e in events)
    # Deciding again requests the very same items; a step begun by another event, new ones.
    assert [a.event.id for a in request_items(ready, JOB, SPEC, APP, "in")] == [
        e.id for e in events
    ]
    reset = cause(JobReset)
    assert {a.event.aggregate_id for a in request_items(reset, JOB, SPEC, APP, "in")}.isdisjoint(
        e.aggregate_id for e in events
    )


def test_a_postprocessed_job_asks_for_its_outputs_and_an_unknown_app_for_nothing() -> None:
    done = cause(JobPostprocessed)
    [append] = request_items(done, JOB, SPEC, APP, "out")
    assert isinstance(append.event.data, TransferRequestedData)
    assert append.event.data.slot == "result"
    assert append.event.data.local_path == "runs/7/out/result.h5"
    assert request_items(done, JOB, SPEC, None, "out") == []


def step(direction: str, state: JobState, *items: tuple[str, TransferState, str]) -> StepView:
    return StepView(
        job_id=JOB, site=SITE, step_id=uuid.uuid4(), direction=direction,  # type: ignore[arg-type]
        job_state=state, job_seq=SEQ, items=[StepItem(*item) for item in items],
    )  # fmt: skip


OK = TransferState.SUCCEEDED


def test_the_last_input_in_stages_the_job_in() -> None:
    settled = cause(TransferSucceeded, job=uuid.uuid4())
    view = step("in", JobState.READY, ("raw", OK, ""), ("calib", OK, ""))
    [append] = settle_step(settled, view, SPEC)
    assert isinstance(append.event, JobStagedIn)
    assert append.event.data.work == SPEC  # the site's preprocess hook gets the job's spec
    assert folded(view_in(JobState.READY), [append]).state == JobState.STAGED_IN
    # Whichever item came last decides, and the same event either way.
    other = cause(TransferSucceeded, job=uuid.uuid4())
    assert [a.event.id for a in settle_step(other, view, SPEC)] == [append.event.id]


def test_the_last_output_out_stages_the_job_out() -> None:
    view = step("out", JobState.POSTPROCESSED, ("result", OK, ""))
    [append] = settle_step(cause(TransferSucceeded), view, SPEC)
    assert isinstance(append.event, JobStagedOut)
    assert folded(view_in(JobState.POSTPROCESSED), [append]).state == JobState.STAGED_OUT


def test_a_step_with_items_still_moving_waits() -> None:
    view = step("in", JobState.READY, ("raw", OK, ""), ("calib", TransferState.SUBMITTED, ""))
    assert settle_step(cause(TransferSucceeded), view, SPEC) == []


@pytest.mark.parametrize("direction", ["in", "out"])
def test_a_failed_item_fails_the_job_with_its_reason(direction: str) -> None:
    state = JobState.READY if direction == "in" else JobState.POSTPROCESSED
    view = step(direction, state, ("raw", TransferState.FAILED, "No such file or directory"),
                ("calib", TransferState.SUBMITTED, ""))  # fmt: skip
    [append] = settle_step(cause(TransferSucceeded), view, SPEC)
    assert isinstance(append.event, JobFailed)
    assert isinstance(append.event.data, FailureData)
    word = "stage-in" if direction == "in" else "stage-out"
    assert append.event.data.reason == f"{word} of slot 'raw' failed: No such file or directory"
    assert append.event.data.cause == ("transfer raw: No such file or directory",)
    assert folded(view_in(state), [append]).state == JobState.FAILED


@pytest.mark.parametrize("state", [JobState.KILLED, JobState.FAILED, JobState.PREPROCESSED])
def test_an_item_of_a_job_that_moved_on_decides_nothing(state: JobState) -> None:
    view = step("in", state, ("raw", OK, ""), ("calib", OK, ""))
    assert settle_step(cause(TransferSucceeded), view, SPEC) == []
