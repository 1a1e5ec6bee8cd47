"""The Slurm adapter over captured sbatch/squeue/scancel/sinfo/sacct output and a jobcomp log."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from lodestream.platform_adapters.errors import (
    SchedulerCommandFailed,
    SchedulerUnavailable,
    SubmitRejected,
    UnknownBatchJob,
    UnparseableOutput,
)
from lodestream.platform_adapters.schedulers import BackfillWindow, BatchRequest, SlurmScheduler
from lodestream.platform_adapters.schedulers.runner import CommandResult
from lodestream.platform_adapters.schedulers.slurm.parse import (
    parse_sbatch,
    parse_squeue_json,
    parse_squeue_text,
)
from lodestream.platform_adapters.schedulers.slurm.render import (
    render_sbatch_argv,
    render_sbatch_header,
)
from lodestream.schemas.resources import SchedulerState
from tests.support.scheduler_runner import DATA, ScriptedRunner, result

NOW = datetime(2024, 3, 1, 11, 0, tzinfo=UTC)
SCRIPT = Path("/home/alice/site/batch/pilot-01.sh")
REQUEST = BatchRequest(
    project="lode",
    queue="debug",
    nodes=3,
    wall_time_min=60,
    job_name="pilot-01",
    options={"constraint": "gpu", "exclusive": ""},
    extra_args=("--signal=B:TERM@60",),
)


def slurm(
    *replies: CommandResult, jobcomp_path: Path | None = None
) -> tuple[SlurmScheduler, ScriptedRunner]:
    runner = ScriptedRunner(list(replies))
    scheduler = SlurmScheduler(
        runner=runner, user="alice", tz=UTC, clock=lambda: NOW, jobcomp_path=jobcomp_path
    )
    return scheduler, runner


def test_sbatch_argv_asks_for_everything_and_puts_output_beside_the_script() -> None:
    assert render_sbatch_argv(SCRIPT, REQUEST) == [
        "sbatch",
        "--parsable",
        "--nodes=3",
        "--time=60",
        "--account=lode",
        "--partition=debug",
        "--job-name=pilot-01",
        "--constraint=gpu",
        "--exclusive",
        "--output=/home/alice/site/batch/pilot-01.%j.out",
        "--error=/home/alice/site/batch/pilot-01.%j.err",
        "--signal=B:TERM@60",
        "/home/alice/site/batch/pilot-01.sh",
    ]


def test_a_percent_sign_in_the_path_is_not_read_as_a_pattern() -> None:
    argv = render_sbatch_argv(Path("/scratch/100%/p.sh"), BatchRequest(wall_time_min=5))
    assert "--output=/scratch/100%%/p.%j.out" in argv


def test_sbatch_header() -> None:
    assert render_sbatch_header(REQUEST) == (
        "#SBATCH --nodes=3\n"
        "#SBATCH --time=60\n"
        "#SBATCH --account=lode\n"
        "#SBATCH --partition=debug\n"
        "#SBATCH --job-name=pilot-01\n"
        "#SBATCH --constraint=gpu\n"
        "#SBATCH --exclusive\n"
    )


def test_submit_runs_sbatch_beside_the_script_with_the_jobs_environment() -> None:
    scheduler, runner = slurm(result("slurm", stdout="sbatch_parsable.out"))
    job_id = scheduler.submit(SCRIPT, wall_time_min=10, env={"LODE_SITE": "perlmutter"})
    assert job_id == "4242"
    (call,) = runner.calls
    assert call.argv[:4] == ["sbatch", "--parsable", "--nodes=1", "--time=10"]
    assert call.env == {"LODE_SITE": "perlmutter"}
    assert call.cwd == SCRIPT.parent


@pytest.mark.parametrize(
    ("stdout", "job_id"),
    [
        ("4242\n", "4242"),
        ("4243;perlmutter\n", "4243"),
        ("Submitted batch job 4244\n", "4244"),
        ("sbatch: warning: something\n4245\n", "4245"),
    ],
)
def test_sbatch_ids(stdout: str, job_id: str) -> None:
    assert parse_sbatch(CommandResult(("sbatch",), 0, stdout, "")) == job_id


def test_a_refused_submission_carries_slurms_words() -> None:
    scheduler, _ = slurm(result("slurm", stderr="sbatch_invalid_account.err", returncode=1))
    with pytest.raises(SubmitRejected, match="Invalid account or account/partition") as caught:
        scheduler.submit(SCRIPT, wall_time_min=10)
    assert caught.value.returncode == 1


def test_sbatch_saying_nothing_useful_is_unparseable() -> None:
    with pytest.raises(UnparseableOutput):
        parse_sbatch(CommandResult(("sbatch",), 0, "queued, probably\n", ""))


def test_squeue_json_of_slurm_22_05(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        jobs = parse_squeue_json(result("slurm", stdout="squeue_22.05.json"), now=NOW)
    assert set(jobs) == {"4242", "4243", "4240"}
    running = jobs["4242"]
    assert running.state is SchedulerState.RUNNING
    assert running.hostnames == ("nid001", "nid002", "nid003")
    assert running.nodes == 3
    assert running.wall_time_min == 60
    assert running.start_time == datetime(2024, 3, 1, 9, 59, tzinfo=UTC)
    assert running.elapsed_s == 3660
    assert running.reason == ""
    pending = jobs["4243"]
    assert pending.state is SchedulerState.QUEUED
    assert pending.start_time is None  # squeue's start_time of a pending job is a guess
    assert pending.reason == "Priority"
    assert jobs["4240"].state is SchedulerState.WALLTIME_EXPIRED
    assert jobs["4240"].elapsed_s == 60
    assert "half-written" in caplog.text  # the record without a job id: skipped, said


def test_squeue_json_of_slurm_23_11(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        jobs = parse_squeue_json(result("slurm", stdout="squeue_23.11.json"), now=NOW)
    assert set(jobs) == {"5000", "5001", "5002", "5003"}
    assert jobs["5001"].state is SchedulerState.RUNNING
    assert jobs["5001"].hostnames == ("nid001", "nid002")
    assert jobs["5001"].wall_time_min == 30
    assert jobs["5002"].state is SchedulerState.QUEUED
    assert jobs["5002"].native_state == "PENDING,REQUEUED"
    assert jobs["5002"].wall_time_min is None  # infinite
    assert jobs["5000"].state is SchedulerState.FAILED
    assert jobs["5000"].exit_code == 3
    assert jobs["5003"].state is SchedulerState.UNKNOWN
    assert "RECONFIGURING_IN_A_NEW_WAY" in caplog.text
    assert "nid[007-" in caplog.text  # the bad host list: that job skipped, the rest kept


def test_an_empty_queue() -> None:
    assert parse_squeue_json(result("slurm", stdout="squeue_empty_23.11.json"), now=NOW) == {}


def test_a_purged_job_id_is_absent_not_an_error() -> None:
    scheduler, runner = slurm(result("slurm", stderr="squeue_invalid_id.err", returncode=1))
    assert scheduler.status(["4200"]) == {}
    assert runner.argvs == [["squeue", "--json", "--jobs=4200"]]


def test_status_of_all_the_users_jobs() -> None:
    scheduler, runner = slurm(result("slurm", stdout="squeue_22.05.json"))
    assert set(scheduler.status()) == {"4240", "4242", "4243"}
    assert runner.argvs == [["squeue", "--json", "--user=alice"]]


def test_status_keeps_only_the_ids_asked_for() -> None:
    scheduler, _ = slurm(result("slurm", stdout="squeue_22.05.json"))
    assert set(scheduler.status(["4242", "4243"])) == {"4242", "4243"}


def test_truncated_json_is_a_clear_error() -> None:
    with pytest.raises(UnparseableOutput, match="not JSON"):
        parse_squeue_json(result("slurm", stdout="squeue_truncated.json"), now=NOW)


def test_a_controller_that_does_not_answer_is_an_error_in_its_words() -> None:
    down = CommandResult(
        ("squeue",), 1, "", "slurm_load_jobs error: Unable to contact slurm controller\n"
    )
    with pytest.raises(SchedulerCommandFailed, match="Unable to contact slurm controller"):
        parse_squeue_json(down, now=NOW)


def test_squeue_text(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        jobs = parse_squeue_text(result("slurm", stdout="squeue_text.out"), tz=UTC)
    assert set(jobs) == {"4242", "4243", "4244", "4246"}
    assert jobs["4242"].elapsed_s == 754
    assert jobs["4242"].start_time == datetime(2024, 3, 1, 10, 39, tzinfo=UTC)
    assert jobs["4243"].start_time is None
    assert jobs["4244"].elapsed_s == 93784  # 1-02:03:04
    assert jobs["4244"].state is SchedulerState.RUNNING  # COMPLETING: not over yet
    assert jobs["4246"].wall_time_min is None
    assert jobs["4246"].hostnames == ("nid005", "nid007")
    assert "4245 RUNNING 1 debug" in caplog.text


def test_a_squeue_without_json_falls_back_to_text_for_good() -> None:
    scheduler, runner = slurm(
        result("slurm", stderr="squeue_no_json.err", returncode=1),
        result("slurm", stdout="squeue_text.out"),
        result("slurm", stdout="squeue_text.out"),
    )
    assert "4242" in scheduler.status()
    assert "4242" in scheduler.status(["4242"])
    assert [argv[:2] for argv in runner.argvs] == [
        ["squeue", "--json"],
        ["squeue", "--noheader"],
        ["squeue", "--noheader"],
    ]
    assert runner.argvs[2][-1] == "--jobs=4242"


@pytest.mark.parametrize(
    ("reply", "deleted"),
    [
        (CommandResult(("scancel",), 0, "", ""), True),
        (result("slurm", stderr="scancel_invalid_id.err", returncode=1), False),
        (result("slurm", stderr="scancel_completed.err", returncode=1), False),
    ],
)
def test_scancel(reply: CommandResult, deleted: bool) -> None:
    scheduler, runner = slurm(reply)
    assert scheduler.delete("4242") is deleted
    assert runner.argvs == [["scancel", "4242"]]


def test_scancel_refused_is_an_error() -> None:
    scheduler, _ = slurm(result("slurm", stderr="scancel_denied.err", returncode=1))
    with pytest.raises(SchedulerCommandFailed, match="Access/permission denied"):
        scheduler.delete("4242")


def test_backfill_windows_from_idle_nodes_and_coming_reservations(
    caplog: pytest.LogCaptureFixture,
) -> None:
    scheduler, runner = slurm(
        result("slurm", stdout="sinfo_idle.out"),
        result("slurm", stdout="sinfo_reservations.out"),
    )
    with caplog.at_level(logging.WARNING):
        windows = scheduler.backfill_windows()
    # debug: nid001-003 for the partition's hour (nid002's maintenance starts in exactly one).
    # long: nid001 and nid003 for two days; nid002 and nid010 only until the maintenance.
    # nid004 does not respond, the maint partition is down.
    assert windows == [
        BackfillWindow(queue="debug", nodes=3, minutes=60),
        BackfillWindow(queue="long", nodes=2, minutes=2880),
        BackfillWindow(queue="long", nodes=4, minutes=60),
    ]
    assert runner.argvs[0][:2] == ["sinfo", "--Node"]
    assert runner.argvs[1] == ["sinfo", "--reservation", "--noheader"]
    assert "garbage line" in caplog.text


def test_no_idle_nodes_no_reservation_query() -> None:
    scheduler, runner = slurm(CommandResult(("sinfo",), 0, "", ""))
    assert scheduler.backfill_windows() == []
    assert len(runner.calls) == 1


def test_sacct_record_of_a_job_that_ran_out_of_time() -> None:
    scheduler, runner = slurm(result("slurm", stdout="sacct_timeout.out"))
    record = scheduler.accounting("4240")
    assert record.state is SchedulerState.WALLTIME_EXPIRED
    assert record.start_time == datetime(2024, 3, 1, 8, 58, tzinfo=UTC)
    assert record.end_time == datetime(2024, 3, 1, 8, 59, 2, tzinfo=UTC)
    assert record.exit_code == 0
    assert record.hostnames == ("nid004",)
    assert runner.argvs == [
        [
            "sacct",
            "--noheader",
            "--parsable2",
            "--allocations",
            "--jobs=4240",
            "--format=JobIDRaw,State,ExitCode,Start,End,NNodes,NodeList",
        ]
    ]


def test_sacct_record_of_a_cancelled_job_keeps_the_signal() -> None:
    scheduler, _ = slurm(result("slurm", stdout="sacct_cancelled.out"))
    record = scheduler.accounting("4241")
    assert record.state is SchedulerState.CANCELLED
    assert record.native_state == "CANCELLED by 1000"
    assert (record.exit_code, record.signal) == (0, 15)


def test_sacct_record_of_a_job_cancelled_before_it_started() -> None:
    scheduler, _ = slurm(result("slurm", stdout="sacct_pending_cancelled.out"))
    record = scheduler.accounting("4247")
    assert record.start_time is None
    assert record.hostnames == ()
    assert record.final


def test_sacct_record_of_a_running_job_has_no_end() -> None:
    scheduler, _ = slurm(result("slurm", stdout="sacct_running.out"))
    record = scheduler.accounting("4242")
    assert record.state is SchedulerState.RUNNING
    assert record.end_time is None
    assert not record.final


def test_sacct_skips_a_garbled_line(caplog: pytest.LogCaptureFixture) -> None:
    scheduler, _ = slurm(result("slurm", stdout="sacct_garbled.out"))
    with caplog.at_level(logging.WARNING):
        record = scheduler.accounting("4248")
    assert (record.state, record.exit_code) == (SchedulerState.FAILED, 2)
    assert "4 fields" in caplog.text


def test_sacct_without_a_record() -> None:
    scheduler, _ = slurm(result("slurm", stdout="sacct_empty.out"))
    with pytest.raises(UnknownBatchJob):
        scheduler.accounting("4200")


def test_sacct_without_slurmdbd_points_at_jobcomp() -> None:
    scheduler, _ = slurm(result("slurm", stderr="sacct_storage_disabled.err", returncode=1))
    with pytest.raises(SchedulerCommandFailed, match=r"storage is disabled.*jobcomp/filetxt"):
        scheduler.accounting("4240")


def test_jobcomp_log_last_line_of_a_requeued_job_wins() -> None:
    scheduler, runner = slurm(jobcomp_path=DATA / "slurm" / "jobcomp.log")
    record = scheduler.accounting("4240")
    assert record.state is SchedulerState.WALLTIME_EXPIRED
    assert record.hostnames == ("nid004", "nid005")
    assert record.nodes == 2
    assert (record.exit_code, record.signal) == (0, 15)
    assert record.start_time == datetime(2024, 3, 1, 8, 58, tzinfo=UTC)
    assert runner.calls == []


def test_jobcomp_log_skips_a_cut_line(caplog: pytest.LogCaptureFixture) -> None:
    scheduler, _ = slurm(jobcomp_path=DATA / "slurm" / "jobcomp.log")
    with caplog.at_level(logging.WARNING):
        record = scheduler.accounting("4241")
    assert record.state is SchedulerState.CANCELLED
    assert record.start_time is None  # cancelled while pending: StartTime=Unknown
    assert "JobSta" in caplog.text


def test_jobcomp_log_times_are_the_controllers_local_time() -> None:
    runner = ScriptedRunner([])
    chicago = SlurmScheduler(
        runner=runner, tz=ZoneInfo("America/Chicago"), jobcomp_path=DATA / "slurm" / "jobcomp.log"
    )
    record = chicago.accounting("4239")
    assert record.start_time == datetime(2024, 3, 1, 14, 0, tzinfo=UTC)  # CST is UTC-6


def test_a_job_still_running_is_read_from_squeue_when_jobcomp_has_no_line() -> None:
    scheduler, runner = slurm(
        result("slurm", stdout="squeue_22.05.json"), jobcomp_path=DATA / "slurm" / "jobcomp.log"
    )
    record = scheduler.accounting("4243")
    assert record.state is SchedulerState.QUEUED
    assert record.end_time is None
    assert runner.argvs == [["squeue", "--json", "--jobs=4243"]]


def test_a_job_neither_in_jobcomp_nor_in_squeue_is_unknown() -> None:
    scheduler, _ = slurm(
        result("slurm", stderr="squeue_invalid_id.err", returncode=1),
        jobcomp_path=DATA / "slurm" / "jobcomp.log",
    )
    with pytest.raises(UnknownBatchJob, match=r"jobcomp\.log"):
        scheduler.accounting("9999")


def test_an_unreadable_jobcomp_log_says_where_it_looked(tmp_path: Path) -> None:
    scheduler, _ = slurm(jobcomp_path=tmp_path / "nope.log")
    with pytest.raises(SchedulerUnavailable, match=r"nope\.log"):
        scheduler.accounting("4240")
