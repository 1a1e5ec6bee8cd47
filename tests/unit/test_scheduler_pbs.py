"""The PBS adapter over captured qsub, ``qstat -f -F json``, qdel and ``pbsnodes -F json``."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lodestream.platform_adapters.errors import (
    InvalidSubmission,
    SchedulerCommandFailed,
    SubmitRejected,
    UnknownBatchJob,
    UnparseableOutput,
)
from lodestream.platform_adapters.schedulers import BackfillWindow, BatchRequest, PbsScheduler
from lodestream.platform_adapters.schedulers.pbs import (
    PBS_STATES,
    parse_qstat,
    pbs_state,
    render_pbs_header,
    render_qsub_argv,
)
from lodestream.platform_adapters.schedulers.runner import CommandResult
from lodestream.schemas.resources import SchedulerState
from tests.support.scheduler_runner import ScriptedRunner, captured, result

NOW = datetime(2024, 3, 1, 11, 0, tzinfo=UTC)
SERVER = "polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov"
SCRIPT = Path("/home/alice/site/batch/pilot-01.sh")
REQUEST = BatchRequest(
    project="lode",
    queue="debug",
    nodes=2,
    wall_time_min=90,
    job_name="pilot-01",
    options={"select": "system=polaris", "filesystems": "home:eagle", "place": "scatter"},
    env={"LODE_SITE": "polaris", "LODE_TAGS": "a=1,b=2"},
)


def pbs(*replies: CommandResult, default_queue: str = "") -> tuple[PbsScheduler, ScriptedRunner]:
    runner = ScriptedRunner(list(replies))
    scheduler = PbsScheduler(
        runner=runner, user="alice", tz=UTC, clock=lambda: NOW, default_queue=default_queue
    )
    return scheduler, runner


def test_qsub_argv_uses_select_chunks_and_names_the_exported_variables() -> None:
    assert render_qsub_argv(SCRIPT, REQUEST) == [
        "qsub",
        "-A", "lode",
        "-q", "debug",
        "-N", "pilot-01",
        "-l", "select=2:system=polaris",
        "-l", "walltime=01:30:00",
        "-l", "filesystems=home:eagle",
        "-l", "place=scatter",
        "-o", "/home/alice/site/batch/pilot-01.out",
        "-e", "/home/alice/site/batch/pilot-01.err",
        "-v", "LODE_SITE,LODE_TAGS",
        "/home/alice/site/batch/pilot-01.sh",
    ]  # fmt: skip


def test_pbs_header() -> None:
    assert render_pbs_header(REQUEST) == (
        "#PBS -A lode\n"
        "#PBS -q debug\n"
        "#PBS -N pilot-01\n"
        "#PBS -l select=2:system=polaris\n"
        "#PBS -l walltime=01:30:00\n"
        "#PBS -l filesystems=home:eagle\n"
        "#PBS -l place=scatter\n"
    )


def test_a_resource_without_a_value_cannot_be_rendered() -> None:
    with pytest.raises(InvalidSubmission, match="needs a value"):
        render_qsub_argv(SCRIPT, BatchRequest(wall_time_min=5, options={"place": ""}))


def test_submit_passes_the_values_through_qsubs_environment() -> None:
    scheduler, runner = pbs(result("pbs", stdout="qsub.out"))
    job_id = scheduler.submit(SCRIPT, wall_time_min=10, env={"LODE_TAGS": "a=1,b=2"})
    assert job_id == f"8123.{SERVER}"
    assert runner.calls[0].env == {"LODE_TAGS": "a=1,b=2"}
    assert runner.calls[0].cwd == SCRIPT.parent


def test_an_unknown_queue_is_a_refusal_in_pbs_words() -> None:
    scheduler, _ = pbs(result("pbs", stderr="qsub_unknown_queue.err", returncode=170))
    with pytest.raises(SubmitRejected, match="qsub exited 170: qsub: Unknown queue"):
        scheduler.submit(SCRIPT, wall_time_min=10, queue="nope")


def test_qstat_lists_the_users_jobs_only(caplog: pytest.LogCaptureFixture) -> None:
    scheduler, runner = pbs(result("pbs", stdout="qstat_f.json"))
    with caplog.at_level(logging.WARNING):
        jobs = scheduler.status()
    assert runner.argvs == [["qstat", "-f", "-F", "json"]]
    assert set(jobs) == {f"8123.{SERVER}", f"8124.{SERVER}"}  # not bob's, not the garbled one
    running = jobs[f"8123.{SERVER}"]
    assert running.state is SchedulerState.RUNNING
    assert running.hostnames == ("x3005c0s13b0n0", "x3005c0s13b1n0")
    assert running.nodes == 2
    assert running.wall_time_min == 60
    assert running.start_time == datetime(2024, 3, 1, 10, 27, tzinfo=UTC)
    assert running.elapsed_s == 754  # resources_used.walltime
    queued = jobs[f"8124.{SERVER}"]
    assert queued.state is SchedulerState.QUEUED
    assert queued.reason.startswith("Not Running: Insufficient amount of resource")
    assert "8126" in caplog.text


def test_qstat_with_ids_includes_finished_jobs() -> None:
    scheduler, runner = pbs(result("pbs", stdout="qstat_x_finished.json"))
    jobs = scheduler.status([f"8120.{SERVER}", f"8121.{SERVER}"])
    assert runner.argvs == [["qstat", "-x", "-f", "-F", "json", f"8120.{SERVER}", f"8121.{SERVER}"]]
    assert jobs[f"8120.{SERVER}"].state is SchedulerState.FINISHED
    assert jobs[f"8121.{SERVER}"].state is SchedulerState.WALLTIME_EXPIRED


def test_finished_jobs_end_as_exit_status_and_substate_say() -> None:
    jobs = parse_qstat(result("pbs", stdout="qstat_x_finished.json"), owner=None, now=NOW, tz=UTC)
    states = {job_id.split(".")[0]: (s.state, s.exit_code) for job_id, s in jobs.items()}
    assert states == {
        "8120": (SchedulerState.FINISHED, 0),
        "8121": (SchedulerState.WALLTIME_EXPIRED, -29),
        "8122": (SchedulerState.CANCELLED, 271),
        "8127": (SchedulerState.FAILED, 3),
    }


def test_an_invalid_backslash_escape_in_one_job_does_not_spoil_the_listing() -> None:
    # PBS writes LODE_TAGS as "beamline=8id\,mode=mpi", which is not JSON.
    assert "\\," in captured("pbs", "qstat_f.json")
    jobs = parse_qstat(result("pbs", stdout="qstat_f.json"), owner="alice", now=NOW, tz=UTC)
    assert f"8123.{SERVER}" in jobs


def test_an_escaped_backslash_before_a_comma_stays_valid() -> None:
    text = '{"Jobs": {"1.s": {"job_state": "Q", "Job_Name": "a\\\\,b"}}}'
    jobs = parse_qstat(CommandResult(("qstat",), 0, text, ""), owner=None, now=NOW, tz=UTC)
    assert jobs["1.s"].state is SchedulerState.QUEUED


def test_an_empty_server_has_no_jobs_key() -> None:
    scheduler, _ = pbs(result("pbs", stdout="qstat_empty.json"))
    assert scheduler.status() == {}


def test_unknown_ids_are_absent_and_the_others_still_read() -> None:
    mixed = result("pbs", stdout="qstat_x_finished.json", stderr="qstat_unknown_id.err")
    scheduler, _ = pbs(CommandResult(mixed.argv, 153, mixed.stdout, mixed.stderr))
    jobs = scheduler.status([f"8120.{SERVER}", f"9999.{SERVER}"])
    assert set(jobs) == {f"8120.{SERVER}"}


def test_only_unknown_ids() -> None:
    scheduler, _ = pbs(result("pbs", stderr="qstat_unknown_id.err", returncode=153))
    assert scheduler.status([f"9999.{SERVER}"]) == {}


def test_a_server_that_does_not_answer_is_an_error() -> None:
    scheduler, _ = pbs(result("pbs", stderr="qstat_server_down.err", returncode=1))
    with pytest.raises(SchedulerCommandFailed, match="cannot connect to server"):
        scheduler.status()


def test_truncated_json_is_a_clear_error() -> None:
    scheduler, _ = pbs(result("pbs", stdout="qstat_truncated.json"))
    with pytest.raises(UnparseableOutput, match="not JSON"):
        scheduler.status()


def test_accounting_reads_the_history_record() -> None:
    scheduler, runner = pbs(result("pbs", stdout="qstat_x_finished.json"))
    record = scheduler.accounting(f"8121.{SERVER}")
    assert runner.argvs == [["qstat", "-x", "-f", "-F", "json", f"8121.{SERVER}"]]
    assert record.state is SchedulerState.WALLTIME_EXPIRED
    assert record.start_time == datetime(2024, 3, 1, 9, 30, tzinfo=UTC)
    assert record.end_time == datetime(2024, 3, 1, 9, 40, 5, tzinfo=UTC)  # obittime


def test_accounting_of_a_running_job_has_no_end() -> None:
    scheduler, _ = pbs(result("pbs", stdout="qstat_f.json"))
    record = scheduler.accounting(f"8123.{SERVER}")
    assert record.state is SchedulerState.RUNNING
    assert record.end_time is None


def test_accounting_of_an_unknown_job() -> None:
    scheduler, _ = pbs(result("pbs", stderr="qstat_unknown_id.err", returncode=153))
    with pytest.raises(UnknownBatchJob, match="Unknown Job Id"):
        scheduler.accounting(f"9999.{SERVER}")


@pytest.mark.parametrize(
    ("reply", "deleted"),
    [
        (CommandResult(("qdel",), 0, "", ""), True),
        (result("pbs", stderr="qdel_unknown_id.err", returncode=153), False),
        (result("pbs", stderr="qdel_finished.err", returncode=35), False),
    ],
)
def test_qdel(reply: CommandResult, deleted: bool) -> None:
    scheduler, runner = pbs(reply)
    assert scheduler.delete(f"8120.{SERVER}") is deleted
    assert runner.argvs == [["qdel", f"8120.{SERVER}"]]


def test_qdel_unauthorized_is_an_error() -> None:
    scheduler, _ = pbs(result("pbs", stderr="qdel_unauthorized.err", returncode=159))
    with pytest.raises(SchedulerCommandFailed, match="Unauthorized Request"):
        scheduler.delete(f"8124.{SERVER}")


def test_free_nodes_per_queue(caplog: pytest.LogCaptureFixture) -> None:
    scheduler, runner = pbs(result("pbs", stdout="pbsnodes.json"), default_queue="workq")
    with caplog.at_level(logging.WARNING):
        windows = scheduler.backfill_windows()
    assert runner.argvs == [["pbsnodes", "-a", "-F", "json"]]
    # Busy, reserved, down and the state-less node are out; pbsnodes says nothing of how long.
    assert windows == [
        BackfillWindow(queue="debug", nodes=2, minutes=None),
        BackfillWindow(queue="preemptable", nodes=1, minutes=None),
        BackfillWindow(queue="workq", nodes=1, minutes=None),
    ]
    assert "x3007c0s1b1n0" in caplog.text


@pytest.mark.parametrize(
    ("job_state", "substate", "exit_status", "state"),
    [
        ("Q", 10, None, SchedulerState.QUEUED),
        ("R", 42, None, SchedulerState.RUNNING),
        ("F", 92, 0, SchedulerState.FINISHED),
        ("F", 92, -29, SchedulerState.WALLTIME_EXPIRED),
        ("F", 91, 271, SchedulerState.CANCELLED),
        ("F", 91, None, SchedulerState.CANCELLED),  # deleted while queued
        ("F", 93, None, SchedulerState.FAILED),
        ("F", 92, 1, SchedulerState.FAILED),
        ("X", 92, 0, SchedulerState.FINISHED),
    ],
)
def test_pbs_state(
    job_state: str, substate: int, exit_status: int | None, state: SchedulerState
) -> None:
    assert pbs_state(job_state, substate, exit_status) is state


def test_every_pbs_job_state_letter_is_in_the_table() -> None:
    assert set(PBS_STATES) == set("BEFHMQRSTUWX")
