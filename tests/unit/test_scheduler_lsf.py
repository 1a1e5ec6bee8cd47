"""The LSF adapter over captured bsub / ``bjobs -json`` / bkill / bslots output."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lodestream.agents.site.scheduler.decide import find_submitted
from lodestream.platform_adapters.errors import (
    SchedulerCommandFailed,
    SubmitRejected,
    UnknownBatchJob,
    UnparseableOutput,
)
from lodestream.platform_adapters.schedulers import BackfillWindow, BatchRequest, LsfScheduler
from lodestream.platform_adapters.schedulers.lsf import (
    BJOBS_FIELDS,
    lsf_duration_s,
    lsf_time,
    render_bsub_argv,
    render_bsub_header,
)
from lodestream.platform_adapters.schedulers.runner import CommandResult
from lodestream.schemas.resources import SchedulerState
from tests.support.scheduler_runner import ScriptedRunner, result

NOW = datetime(2024, 3, 1, 11, 0, tzinfo=UTC)
SCRIPT = Path("/ccs/home/alice/site/batch/pilot-01.sh")
REQUEST = BatchRequest(
    project="LOD123",
    queue="batch",
    nodes=4,
    wall_time_min=45,
    job_name="pilot-01",
    options={"alloc_flags": "smt4", "exclusive": ""},
)


def lsf(
    *replies: CommandResult, slots_per_node: int | None = None
) -> tuple[LsfScheduler, ScriptedRunner]:
    runner = ScriptedRunner(list(replies))
    scheduler = LsfScheduler(
        runner=runner, user="alice", tz=UTC, clock=lambda: NOW, slots_per_node=slots_per_node
    )
    return scheduler, runner


def test_bsub_argv_asks_for_nodes() -> None:
    assert render_bsub_argv(SCRIPT, REQUEST) == [
        "bsub",
        "-P", "LOD123",
        "-q", "batch",
        "-nnodes", "4",
        "-W", "45",
        "-J", "pilot-01",
        "-alloc_flags", "smt4",
        "-exclusive",
        "-o", "/ccs/home/alice/site/batch/pilot-01.%J.out",
        "-e", "/ccs/home/alice/site/batch/pilot-01.%J.err",
        "/ccs/home/alice/site/batch/pilot-01.sh",
    ]  # fmt: skip


def test_bsub_argv_with_slots_per_node() -> None:
    argv = render_bsub_argv(SCRIPT, BatchRequest(nodes=2, wall_time_min=5), slots_per_node=40)
    assert argv[1:7] == ["-n", "80", "-R", "span[ptile=40]", "-W", "5"]


def test_bsub_header() -> None:
    assert render_bsub_header(REQUEST) == (
        "#BSUB -P LOD123\n"
        "#BSUB -q batch\n"
        "#BSUB -nnodes 4\n"
        "#BSUB -W 45\n"
        "#BSUB -J pilot-01\n"
        "#BSUB -alloc_flags smt4\n"
        "#BSUB -exclusive\n"
    )


def test_submit() -> None:
    scheduler, runner = lsf(result("lsf", stdout="bsub.out"))
    assert scheduler.submit(SCRIPT, wall_time_min=10, env={"LODE_SITE": "summit"}) == "31337"
    assert runner.calls[0].env == {"LODE_SITE": "summit"}


def test_a_refused_submission() -> None:
    scheduler, _ = lsf(result("lsf", stderr="bsub_bad_project.err", returncode=255))
    with pytest.raises(SubmitRejected, match="not a valid project name"):
        scheduler.submit(SCRIPT, wall_time_min=10, project="XYZ123")


def test_bjobs_lists_the_users_jobs(caplog: pytest.LogCaptureFixture) -> None:
    scheduler, runner = lsf(result("lsf", stdout="bjobs.json"))
    with caplog.at_level(logging.WARNING):
        jobs = scheduler.status()
    assert runner.argvs == [["bjobs", "-json", "-o", " ".join(BJOBS_FIELDS), "-u", "alice"]]
    assert set(jobs) == {"31337", "31338", "31330"}
    running = jobs["31337"]
    assert running.state is SchedulerState.RUNNING
    assert running.hostnames == ("batch3", "a01n05", "a01n06")  # launch node first, as LSF says
    assert running.elapsed_s == 754
    assert running.wall_time_min == 60
    assert running.start_time == datetime(2024, 3, 1, 10, 27, tzinfo=UTC)
    pending = jobs["31338"]
    assert pending.state is SchedulerState.QUEUED
    assert pending.elapsed_s is None
    assert pending.reason.startswith("Job's requirements")
    done = jobs["31330"]
    assert done.exit_code == 0  # DONE: LSF leaves EXIT_CODE empty
    assert done.start_time == datetime(2023, 12, 31, 23, 50, tzinfo=UTC)  # not in the future
    assert "31339" in caplog.text


def test_bjobs_shows_each_jobs_name() -> None:
    scheduler, runner = lsf(result("lsf", stdout="bjobs.json"))
    jobs = scheduler.status()
    assert "job_name" in runner.argvs[0][3].split()
    assert {k: v.name for k, v in jobs.items()} == {
        "31337": "lode-5b0c7a8e-2f1d-4c3b-9a6e-0d4f8e2b7c61",
        "31338": "lode-7e2a9c14-b3d8-4f05-a1c6-93e4d2f0b8a7",
        "31330": "/ccs/home/alice/postprocess.sh",  # no -J: LSF names a job by its command
    }
    # A submission whose id was lost (bsub hung after queueing it) is found by that name.
    batch = uuid.UUID("7e2a9c14-b3d8-4f05-a1c6-93e4d2f0b8a7")
    assert find_submitted(jobs, batch) == "31338"
    assert find_submitted(jobs, uuid.uuid4()) is None


def test_status_by_id_includes_finished_jobs() -> None:
    scheduler, runner = lsf(result("lsf", stdout="bjobs_a_exits.json"))
    jobs = scheduler.status(["31331", "31332", "31333"])
    assert runner.argvs[0][-4:] == ["-a", "31331", "31332", "31333"]
    assert {k: v.state for k, v in jobs.items()} == {
        "31331": SchedulerState.WALLTIME_EXPIRED,
        "31332": SchedulerState.CANCELLED,
        "31333": SchedulerState.FAILED,
    }
    assert jobs["31333"].exit_code == 3


def test_unknown_ids_are_absent(caplog: pytest.LogCaptureFixture) -> None:
    scheduler, _ = lsf(result("lsf", stdout="bjobs_not_found.json", returncode=255))
    with caplog.at_level(logging.WARNING):
        assert scheduler.status(["99999"]) == {}
    assert caplog.text == ""  # an unknown id is an answer, not a garbled record


def test_no_jobs_at_all() -> None:
    scheduler, _ = lsf(result("lsf", stderr="bjobs_none.err"))
    assert scheduler.status() == {}


def test_lsf_down_is_an_error() -> None:
    scheduler, _ = lsf(result("lsf", stderr="bjobs_lsf_down.err", returncode=255))
    with pytest.raises(SchedulerCommandFailed, match="LIM"):
        scheduler.status()


def test_truncated_json_is_a_clear_error() -> None:
    scheduler, _ = lsf(result("lsf", stdout="bjobs_truncated.json"))
    with pytest.raises(UnparseableOutput):
        scheduler.status()


def test_accounting_of_a_job_killed_at_its_run_limit() -> None:
    scheduler, runner = lsf(result("lsf", stdout="bjobs_a_exits.json"))
    record = scheduler.accounting("31331")
    assert runner.argvs[0][-2:] == ["-a", "31331"]
    assert record.state is SchedulerState.WALLTIME_EXPIRED
    assert record.exit_code == 140
    assert record.start_time == datetime(2024, 3, 1, 8, 0, tzinfo=UTC)
    assert record.end_time == datetime(2024, 3, 1, 8, 30, tzinfo=UTC)
    assert record.reason.startswith("TERM_RUNLIMIT")


def test_accounting_of_a_running_job_ignores_the_estimated_finish() -> None:
    scheduler, _ = lsf(result("lsf", stdout="bjobs.json"))
    record = scheduler.accounting("31337")
    assert record.end_time is None


def test_accounting_of_an_unknown_job() -> None:
    scheduler, _ = lsf(result("lsf", stdout="bjobs_not_found.json", returncode=255))
    with pytest.raises(UnknownBatchJob):
        scheduler.accounting("99999")


@pytest.mark.parametrize(
    ("reply", "deleted"),
    [
        (result("lsf", stdout="bkill.out"), True),
        (result("lsf", stderr="bkill_finished.err", returncode=255), False),
        (result("lsf", stderr="bkill_unknown.err", returncode=255), False),
    ],
)
def test_bkill(reply: CommandResult, deleted: bool) -> None:
    scheduler, runner = lsf(reply)
    assert scheduler.delete("31337") is deleted
    assert runner.argvs == [["bkill", "31337"]]


def test_bslots_windows_are_already_cumulative(caplog: pytest.LogCaptureFixture) -> None:
    scheduler, _ = lsf(result("lsf", stdout="bslots.out"))
    with caplog.at_level(logging.WARNING):
        windows = scheduler.backfill_windows()
    assert windows == [
        BackfillWindow(queue="batch", nodes=1, minutes=None),
        BackfillWindow(queue="batch", nodes=3, minutes=88),
        BackfillWindow(queue="batch", nodes=5, minutes=60),
        BackfillWindow(queue="batch", nodes=7, minutes=45),
        BackfillWindow(queue="batch", nodes=15, minutes=40),
    ]  # 18 slots for 30 s hold no job of a minute
    assert "a while" in caplog.text


def test_bslots_slots_become_nodes() -> None:
    scheduler, _ = lsf(result("lsf", stdout="bslots.out"), slots_per_node=5)
    assert [w.nodes for w in scheduler.backfill_windows()] == [1, 1, 3]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("UNLIMITED", None),
        ("1 hour 28 minutes 29 seconds", 5309),
        ("2 hours 0 minutes 0 seconds", 7200),
        ("45 minutes 30 seconds", 2730),
        ("1 day 1 second", 86401),
    ],
)
def test_lsf_durations(text: str, seconds: int | None) -> None:
    assert lsf_duration_s(text) == seconds


@pytest.mark.parametrize(
    ("text", "when"),
    [
        ("Mar  1 10:27", datetime(2024, 3, 1, 10, 27, tzinfo=UTC)),
        ("Mar  1 11:27 L", datetime(2024, 3, 1, 11, 27, tzinfo=UTC)),
        ("Mar  1 10:27 2023", datetime(2023, 3, 1, 10, 27, tzinfo=UTC)),
        ("Dec 31 23:50", datetime(2023, 12, 31, 23, 50, tzinfo=UTC)),
        ("", None),
        ("-", None),
    ],
)
def test_lsf_times(text: str, when: datetime | None) -> None:
    assert lsf_time(text, now=NOW, tz=UTC) == when
