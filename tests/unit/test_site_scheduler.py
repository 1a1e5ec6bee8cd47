"""The site's scheduler module without NATS or a scheduler: the pilot's job template, and the
pure decisions (which event for which request, deletion and scheduler status)."""

from __future__ import annotations

import shlex
import subprocess
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lodestream.agents.site.scheduler import decide
from lodestream.agents.site.scheduler.decide import DeletionStep, RequestStep
from lodestream.agents.site.scheduler.pilot_end import (
    pilot_end_path,
    read_pilot_end,
    write_pilot_end,
)
from lodestream.agents.site.scheduler.template import (
    DEFAULT_TEMPLATE,
    LODE_MODULE,
    TemplateError,
    check_passes_filter,
    pilot_values,
    read_template,
    render,
)
from lodestream.platform_adapters.schedulers.base import BatchRecord, BatchStatus
from lodestream.schemas.batch import BatchView, apply_batch, next_batch_state
from lodestream.schemas.events.batch import BatchRequestData
from lodestream.schemas.resources import BatchJobState, SchedulerState

B = BatchJobState
SITE = "alpha"
BATCH = uuid.UUID("01900000-0000-7000-8000-0000000000b1")
REQUESTED = uuid.UUID("01900000-0000-7000-8000-0000000000c1")
DELETION = uuid.UUID("01900000-0000-7000-8000-0000000000d1")
REQUEST = BatchRequestData(num_nodes=3, wall_time_min=30, job_mode="serial")


def view(**changes: object) -> BatchView:
    base = BatchView(id=BATCH, site=SITE, request=REQUEST, requested_id=REQUESTED,
                     state=B.REQUESTED, last_seq=10)  # fmt: skip
    return replace(base, **changes)  # type: ignore[arg-type]


def live(observed: BatchJobState = B.SUBMITTED, **changes: object) -> BatchView:
    fields: dict[str, object] = {"state": observed, "observed": observed, "scheduler": "slurm",
                                 "scheduler_id": "42"}  # fmt: skip
    return view(**(fields | changes))


def status(state: SchedulerState, **fields: object) -> BatchStatus:
    return BatchStatus(scheduler_id="42", state=state, native_state=state.value.upper(),
                       **fields)  # type: ignore[arg-type]  # fmt: skip


# --- the template ----------------------------------------------------------------------------


def values(
    site_dir: Path = Path("/sites/my site"), request: BatchRequestData = REQUEST
) -> dict[str, str]:
    return pilot_values(batch_id=BATCH, site=SITE, site_dir=site_dir, request=request,
                        queue="debug", project="", scheduler="slurm",
                        python="/opt/py thon/bin/python")  # fmt: skip


def with_filter(filter_tags: dict[str, str]) -> BatchRequestData:
    return BatchRequestData.model_validate(REQUEST.model_dump() | {"filter_tags": filter_tags})


def launcher_line(body: str) -> list[str]:
    return shlex.split(" ".join(line.strip().rstrip("\\") for line in body.splitlines()
                                if line.strip().startswith(("exec", "--"))))  # fmt: skip


def test_the_default_template_starts_the_pilot_for_its_batch_job() -> None:
    body = render(read_template(DEFAULT_TEMPLATE), values())
    assert launcher_line(body) == [
        "exec", "/opt/py thon/bin/python", "-m", LODE_MODULE, "launcher",
        "--site", "/sites/my site", "--mode", "serial", "--wall-time-min", "30",
        "--batch-job-id", str(BATCH),
    ]  # fmt: skip
    assert "{{" not in body
    assert "cd '/sites/my site'" in body


def test_the_default_template_passes_the_requests_tag_filter_to_the_pilot() -> None:
    request = with_filter({"beam": "A", "run": "7 b"})
    template = read_template(DEFAULT_TEMPLATE)
    check_passes_filter(template, request)
    assert launcher_line(render(template, values(request=request)))[-4:] == [
        "--tag", "beam:A", "--tag", "run:7 b",
    ]  # fmt: skip


def test_tag_values_are_quoted_so_a_tag_cannot_run_code(tmp_path: Path) -> None:
    evil = {"beam": "A; touch pwned", "run": "$(touch pwned2)`touch pwned3`", "q": "'\"\n"}
    request = with_filter(evil)
    body = render("printf '%s\\0' {{ tag_options }}\n", values(request=request))
    done = subprocess.run(["bash", "-c", body], capture_output=True, text=True, check=True,
                          cwd=tmp_path)  # fmt: skip
    assert done.stdout.split("\0")[:-1] == [
        "--tag", "beam:A; touch pwned", "--tag", "run:$(touch pwned2)`touch pwned3`",
        "--tag", "q:'\"\n",
    ]  # fmt: skip
    assert not list(tmp_path.glob("pwned*"))


def test_a_request_with_tags_is_refused_by_a_template_that_would_drop_them() -> None:
    old = "exec {{ lode }} launcher --site {{ site_dir }} --batch-job-id {{ batch_job_id }}\n"
    check_passes_filter(old, REQUEST)  # no filter: nothing to pass on
    request = with_filter({"beam": "A"})
    with pytest.raises(TemplateError, match=r"job-template.sh has no \{\{ tag_options \}\}"):
        check_passes_filter(old, request, name="job-template.sh")


def test_values_are_quoted_so_a_path_cannot_run_code(tmp_path: Path) -> None:
    evil = tmp_path / "a b; touch pwned $(touch pwned2)"
    evil.mkdir()
    body = render("cd {{ site_dir }} && pwd\n", values(evil))
    done = subprocess.run(["bash", "-c", body], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == str(evil)
    assert not list(tmp_path.glob("pwned*"))


def test_a_shebang_is_left_to_the_scheduler_adapter_and_dollars_are_left_alone() -> None:
    template = "#!/bin/sh\necho $SLURM_JOB_ID ${HOME} {{ batch_job_id }}\n"
    assert render(template, values()) == f"echo $SLURM_JOB_ID ${{HOME}} {BATCH}\n"


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("ok\nmodule load {{ modules }}\n",
         "job-template.sh, line 2: unknown placeholder {{ modules }} (known: batch_job_id,"),
        ("echo {{ site_dir x }}\n", "job-template.sh, line 1: '{{' that is no placeholder"),
        ("echo {{site_dir\n", "job-template.sh, line 1: '{{' that is no placeholder"),
    ],
)  # fmt: skip
def test_a_template_error_names_the_file_line_and_placeholder(template: str, message: str) -> None:
    with pytest.raises(TemplateError) as error:
        render(template, values(), name="job-template.sh")
    assert str(error.value).startswith(message)


def test_a_missing_template_says_where_the_default_is(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match=r"not found .*job-template\.sh\.tmpl"):
        read_template(tmp_path / "job-template.sh")


# --- requests and deletions ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batch", "step"),
    [
        (view(), RequestStep.SUBMIT),
        (live(), RequestStep.TRACK),
        (live(B.RUNNING), RequestStep.TRACK),
        (view(state=B.DELETION_REQUESTED, deletion_id=DELETION), RequestStep.END_UNSUBMITTED),
        (view(state=B.SUBMIT_FAILED), RequestStep.DONE),
        (live(B.FINISHED, state=B.FINISHED), RequestStep.DONE),
    ],
)
def test_what_a_request_calls_for(batch: BatchView, step: RequestStep) -> None:
    assert decide.on_request(batch) is step


@pytest.mark.parametrize(
    ("batch", "step"),
    [
        (view(state=B.DELETION_REQUESTED, deletion_id=DELETION), DeletionStep.END_UNSUBMITTED),
        (live(B.RUNNING, state=B.DELETION_REQUESTED), DeletionStep.CANCEL),
        (live(B.FINISHED), DeletionStep.DONE),
        (view(state=B.SUBMIT_FAILED), DeletionStep.DONE),
    ],
)
def test_what_a_deletion_calls_for(batch: BatchView, step: DeletionStep) -> None:
    assert decide.on_deletion(batch) is step


def test_a_submission_takes_the_sites_defaults_and_options() -> None:
    asked = REQUEST.model_copy(update={"options": {"qos": "high"}})
    plan = decide.plan_submission(
        view(request=asked), queue="debug", project="cosmo",
        site_options={"constraint": "cpu"}, request_options=frozenset({"qos"}),
    )  # fmt: skip
    assert plan == decide.Submission(
        queue="debug", project="cosmo", options={"constraint": "cpu", "qos": "high"}
    )
    own = REQUEST.model_copy(update={"queue": "prod", "project": "mine"})
    plan = decide.plan_submission(view(request=own), queue="debug", project="cosmo",
                                  site_options={}, request_options=frozenset())  # fmt: skip
    assert isinstance(plan, decide.Submission)
    assert (plan.queue, plan.project) == ("prod", "mine")


@pytest.mark.parametrize(
    ("options", "allowed", "says"),
    [
        ({"export": "LD_PRELOAD=/x"}, set(), "'export' is not one this site lets requests set "
                                             "(scheduler.request_options: none)"),
        ({"chdir": "/"}, {"qos"}, "(scheduler.request_options: qos)"),
        ({"constraint": "gpu"}, {"constraint"}, "'constraint' is fixed by the site ('cpu')"),
    ],
)  # fmt: skip
def test_a_request_may_set_only_the_options_the_site_allows(
    options: dict[str, str], allowed: set[str], says: str
) -> None:
    asked = REQUEST.model_copy(update={"options": options})
    plan = decide.plan_submission(view(request=asked), queue="", project="",
                                  site_options={"constraint": "cpu"},
                                  request_options=frozenset(allowed))  # fmt: skip
    assert isinstance(plan, str)
    assert says in plan


def test_submission_events_repeat_with_their_cause_and_chain_on_the_job() -> None:
    first = decide.submitted(view(), "slurm", "42", 10)
    again = decide.submitted(view(), "slurm", "42", 10)
    assert first.event.id == again.event.id
    assert first.event.causation_id == REQUESTED
    assert (first.expect, first.event.data.scheduler, first.event.data.scheduler_id) == (  # type: ignore[attr-defined]
        10, "slurm", "42",
    )  # fmt: skip
    refused = decide.submit_failed(view(), "sbatch: error: invalid account " + "x" * 5000)
    assert refused.event.type == "batch.submit_failed"
    assert len(refused.event.data.reason) == decide.MAX_REASON  # type: ignore[attr-defined]
    ended = decide.ended_unsubmitted(view(state=B.DELETION_REQUESTED, deletion_id=DELETION))
    assert ended.event.data.state == "cancelled"  # type: ignore[attr-defined]
    assert ended.event.causation_id == DELETION
    for append in (first, refused, ended):  # each is legal where it is decided
        next_batch_state(B.DELETION_REQUESTED if append is ended else B.REQUESTED,
                         append.event.type)  # fmt: skip


def test_a_lost_submission_is_found_by_the_job_name_carrying_the_batch_id() -> None:
    listed = {
        "7": BatchStatus(scheduler_id="7", state=SchedulerState.RUNNING, native_state="R",
                         name="lode-" + str(uuid.uuid4())),
        "12": BatchStatus(scheduler_id="12", state=SchedulerState.QUEUED, native_state="PD",
                          name=decide.job_name(BATCH)),
        "9": BatchStatus(scheduler_id="9", state=SchedulerState.QUEUED, native_state="PD",
                         name=decide.job_name(BATCH)),
    }  # fmt: skip
    assert decide.find_submitted(listed, BATCH) == "9"  # the first, should there be two
    assert decide.find_submitted({}, BATCH) is None


# --- syncs -----------------------------------------------------------------------------------

_CHANGES = [
    # (observed, scheduler state) -> appended event type, None: nothing changed
    (B.SUBMITTED, SchedulerState.QUEUED, "batch.queued"),
    (B.SUBMITTED, SchedulerState.RUNNING, "batch.running"),
    (B.QUEUED, SchedulerState.QUEUED, None),
    (B.QUEUED, SchedulerState.RUNNING, "batch.running"),
    (B.RUNNING, SchedulerState.RUNNING, None),
    (B.RUNNING, SchedulerState.QUEUED, "batch.queued"),  # requeued
    (B.RUNNING, SchedulerState.UNKNOWN, None),  # never guessed at
    *[(observed, final, "batch.finished")
      for observed in (B.SUBMITTED, B.QUEUED, B.RUNNING)
      for final in (SchedulerState.FINISHED, SchedulerState.FAILED, SchedulerState.CANCELLED,
                    SchedulerState.WALLTIME_EXPIRED)],
]  # fmt: skip


@pytest.mark.parametrize(("observed", "state", "expected"), _CHANGES)
def test_only_a_change_at_the_scheduler_is_appended(
    observed: BatchJobState, state: SchedulerState, expected: str | None
) -> None:
    batch = live(observed)
    append = decide.on_status(
        batch, status(state, exit_code=0 if state.value == "finished" else None)
    )
    if expected is None:
        assert append is None
        return
    assert append is not None
    assert (append.event.type, append.expect) == (expected, batch.last_seq)
    assert apply_batch(batch, 11, append.event) != batch  # the lifecycle takes it
    for deleting in (B.DELETION_REQUESTED,):  # also while a deletion is pending
        next_batch_state(deleting, append.event.type)


def test_the_end_carries_the_schedulers_exit_code_state_and_words() -> None:
    append = decide.on_status(live(B.RUNNING), status(
        SchedulerState.WALLTIME_EXPIRED, exit_code=0, reason="TimeLimit"))  # fmt: skip
    assert append is not None
    data = append.event.data
    assert (data.exit_code, data.state, data.reason) == (  # type: ignore[attr-defined]
        0, "walltime_expired", "slurm WALLTIME_EXPIRED: TimeLimit",
    )  # fmt: skip


def test_a_sync_decides_the_same_event_again_and_a_new_one_after_the_job_moved() -> None:
    first = decide.on_status(live(), status(SchedulerState.RUNNING))
    again = decide.on_status(live(), status(SchedulerState.RUNNING))
    moved = decide.on_status(live(last_seq=11), status(SchedulerState.RUNNING))
    assert first is not None
    assert again is not None
    assert moved is not None
    assert first.event.id == again.event.id != moved.event.id


AT = datetime(2025, 1, 2, tzinfo=UTC)


def test_a_job_gone_from_the_queue_ends_as_its_accounting_record_says() -> None:
    record = BatchRecord(scheduler_id="42", state=SchedulerState.FAILED, native_state="NODE_FAIL",
                         end_time=AT, exit_code=1)  # fmt: skip
    absence = decide.on_absent(live(B.RUNNING), record, misses=0, vanish_after=2)
    assert absence.append is not None
    assert not absence.missed
    data = absence.append.event.data
    assert (data.state, data.exit_code, data.reason) == ("failed", 1, "slurm NODE_FAIL")  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("state", "pilot_end", "recorded"),
    [
        # the pilot drained at its wall time and exited 0: the scheduler's COMPLETED
        # understates it, and the batch job says what its drained jobs' causes say
        (SchedulerState.FINISHED, SchedulerState.WALLTIME_EXPIRED,
         ("walltime_expired", "slurm FINISHED; its pilot drained at its wall time")),
        (SchedulerState.FINISHED, None, ("finished", "slurm FINISHED")),
        # any other end is the scheduler's to tell
        (SchedulerState.WALLTIME_EXPIRED, SchedulerState.WALLTIME_EXPIRED,
         ("walltime_expired", "slurm WALLTIME_EXPIRED")),
        (SchedulerState.CANCELLED, SchedulerState.WALLTIME_EXPIRED,
         ("cancelled", "slurm CANCELLED")),
        (SchedulerState.FAILED, SchedulerState.WALLTIME_EXPIRED, ("failed", "slurm FAILED")),
    ],
)  # fmt: skip
def test_a_batch_job_whose_pilot_drained_at_its_wall_time_ends_walltime_expired(
    state: SchedulerState, pilot_end: SchedulerState | None, recorded: tuple[str, str]
) -> None:
    listed = decide.on_status(live(B.RUNNING), status(state, exit_code=0), pilot_end=pilot_end)
    record = BatchRecord(scheduler_id="42", state=state, native_state=state.value.upper(),
                         end_time=AT, exit_code=0)  # fmt: skip
    absent = decide.on_absent(live(B.RUNNING), record, misses=0, vanish_after=2,
                              pilot_end=pilot_end).append  # fmt: skip
    for append in (listed, absent):
        assert append is not None
        data = append.event.data
        assert (data.state, data.reason) == recorded  # type: ignore[attr-defined]
        assert data.exit_code == 0  # type: ignore[attr-defined]


def test_a_pilot_leaves_only_a_verdict_the_site_agent_knows(tmp_path: Path) -> None:
    batch = uuid.uuid4()
    path = pilot_end_path(tmp_path / "batch", batch)
    assert read_pilot_end(path) is None  # none left
    write_pilot_end(path, SchedulerState.WALLTIME_EXPIRED)
    assert path.name == f"pilot-{batch}.end"
    assert read_pilot_end(path) is SchedulerState.WALLTIME_EXPIRED
    path.write_text("finished\n")  # nothing a pilot may say
    assert read_pilot_end(path) is None


def test_a_job_accounting_still_has_live_is_waited_for() -> None:
    record = BatchRecord(scheduler_id="42", state=SchedulerState.RUNNING, native_state="RUNNING")
    assert decide.on_absent(live(B.RUNNING), record, misses=5, vanish_after=2) == decide.Absence(
        None, missed=False
    )


def test_a_job_with_no_trace_vanishes_after_the_set_number_of_syncs() -> None:
    batch = live(B.RUNNING)
    assert decide.on_absent(batch, None, misses=0, vanish_after=2) == decide.Absence(None, True)
    gone = decide.on_absent(batch, None, misses=1, vanish_after=2)
    assert gone.append is not None
    data = gone.append.event.data
    assert data.state == "unknown"  # type: ignore[attr-defined]
    assert data.reason == (  # type: ignore[attr-defined]
        "vanished from the queue: slurm lists no job 42 and has no record of it"
    )


def test_a_queued_job_is_queued_again_only_when_the_reason_it_waits_changes() -> None:
    """Slurm's pending reason reaches the log once per change, not once per sync."""
    first = decide.on_status(live(B.SUBMITTED), status(SchedulerState.QUEUED, reason="Priority"))
    assert first is not None
    waiting = apply_batch(live(B.SUBMITTED), 11, first.event)
    assert waiting is not None
    assert (waiting.observed, waiting.reason) == (B.QUEUED, "Priority")
    same = status(SchedulerState.QUEUED, reason="Priority")
    assert decide.on_status(waiting, same) is None
    changed = decide.on_status(waiting, status(SchedulerState.QUEUED, reason="PartitionNodeLimit"))
    assert changed is not None
    assert changed.event.type == "batch.queued"
    assert changed.event.data.reason == "PartitionNodeLimit"  # type: ignore[attr-defined]
    assert changed.expect == 11
    running = apply_batch(waiting, 12, changed.event)
    assert running is not None
    assert decide.on_status(running, status(SchedulerState.RUNNING)) is not None
    # A running job's reason changing is no news: only why it waits is.
    ran = replace(running, observed=B.RUNNING)
    assert decide.on_status(ran, status(SchedulerState.RUNNING, reason="Prolog")) is None
