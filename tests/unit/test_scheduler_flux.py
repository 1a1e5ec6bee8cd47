"""The Flux adapter over captured ``flux batch`` / ``flux jobs`` / ``flux cancel`` output."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lodestream.agents.site.scheduler.decide import find_submitted
from lodestream.platform_adapters.errors import (
    NotSupported,
    SchedulerCommandFailed,
    SubmitRejected,
    UnknownBatchJob,
)
from lodestream.platform_adapters.schedulers import BatchRequest, FluxScheduler
from lodestream.platform_adapters.schedulers.flux import (
    JOBS_FIELDS,
    f58_to_decimal,
    render_batch_argv,
    render_flux_header,
)
from lodestream.platform_adapters.schedulers.runner import CommandResult
from lodestream.schemas.resources import SchedulerState
from tests.support.scheduler_runner import ScriptedRunner, result

SCRIPT = Path("/p/lustre1/alice/site/batch/pilot-01.sh")
REQUEST = BatchRequest(
    project="lodebank",
    queue="pdebug",
    nodes=2,
    wall_time_min=30,
    job_name="pilot-01",
    options={"exclusive": "", "setattr": "system.lode=1"},
)


def flux(*replies: CommandResult) -> tuple[FluxScheduler, ScriptedRunner]:
    runner = ScriptedRunner(list(replies))
    return FluxScheduler(runner=runner, user="alice"), runner


def test_batch_argv() -> None:
    assert render_batch_argv(SCRIPT, REQUEST) == [
        "flux",
        "batch",
        "--nodes=2",
        "--time-limit=30m",
        "--queue=pdebug",
        "--bank=lodebank",
        "--job-name=pilot-01",
        "--exclusive",
        "--setattr=system.lode=1",
        "--output=/p/lustre1/alice/site/batch/pilot-01.{{id}}.out",
        "--error=/p/lustre1/alice/site/batch/pilot-01.{{id}}.err",
        "/p/lustre1/alice/site/batch/pilot-01.sh",
    ]


def test_flux_header() -> None:
    assert render_flux_header(REQUEST).splitlines()[:2] == [
        "#flux: --nodes=2",
        "#flux: --time-limit=30m",
    ]


@pytest.mark.parametrize("stdout", ["batch.out", "batch_ascii.out"])
def test_submit_hands_out_the_decimal_id_whatever_the_locale(stdout: str) -> None:
    scheduler, _ = flux(result("flux", stdout=stdout))
    assert scheduler.submit(SCRIPT, wall_time_min=10) == "3422013227008"


def test_f58() -> None:
    assert f58_to_decimal("ƒ2YtebGEs") == "3422013227008"
    assert f58_to_decimal("3422013227008") == "3422013227008"
    with pytest.raises(ValueError, match="not a Flux job id"):
        f58_to_decimal("ƒ0OIl")


def test_a_refused_submission() -> None:
    scheduler, _ = flux(result("flux", stderr="batch_bad_queue.err", returncode=1))
    with pytest.raises(SubmitRejected, match="debgu"):
        scheduler.submit(SCRIPT, wall_time_min=10, queue="debgu")


def test_jobs(caplog: pytest.LogCaptureFixture) -> None:
    scheduler, runner = flux(result("flux", stdout="jobs.out"))
    with caplog.at_level(logging.WARNING):
        jobs = scheduler.status()
    assert runner.argvs == [
        ["flux", "jobs", "--no-header", f"--format={'|'.join(JOBS_FIELDS)}", "--user=alice"]
    ]
    states = {k: (v.state, v.exit_code) for k, v in jobs.items()}
    assert states == {
        "3422013227008": (SchedulerState.RUNNING, None),
        "3422617206784": (SchedulerState.QUEUED, None),
        "3423288295424": (SchedulerState.FINISHED, 0),
        "3424966016000": (SchedulerState.WALLTIME_EXPIRED, 143),
        "3425452556288": (SchedulerState.CANCELLED, -128),
    }
    running = jobs["3422013227008"]
    assert running.hostnames == ("tioga18", "tioga19")
    assert running.wall_time_min == 30
    assert running.elapsed_s == 754
    assert running.start_time == datetime(2024, 3, 1, 10, 30, 0, 123400, tzinfo=UTC)
    assert jobs["3425452556288"].start_time is None
    assert jobs["3425452556288"].elapsed_s is None
    assert jobs["3425452556288"].wall_time_min is None  # 0: unlimited
    assert "3425452556289|RUN|1" in caplog.text


def test_jobs_shows_each_jobs_name() -> None:
    scheduler, runner = flux(result("flux", stdout="jobs.out"))
    jobs = scheduler.status()
    assert "{name}" in runner.argvs[0][3]
    assert {k: v.name for k, v in jobs.items()} == {
        "3422013227008": "lode-3c9e1f70-5a2b-4d86-9f14-b07e6a2d8c35",
        "3422617206784": "lode-e5b7d2a9-0c4f-4631-a8e2-19d6f3b07c4e",
        "3423288295424": "lammps.sh",
        "3424966016000": "sleep",
        "3425452556288": "flux",
    }
    assert jobs["3424966016000"].reason == "resource allocation expired"
    # A submission whose id was lost (flux batch hung after queueing it) is found by that name.
    batch = uuid.UUID("e5b7d2a9-0c4f-4631-a8e2-19d6f3b07c4e")
    assert find_submitted(jobs, batch) == "3422617206784"
    assert find_submitted(jobs, uuid.uuid4()) is None


def test_a_bar_in_a_note_stays_in_the_note() -> None:
    line = "3425452556288|CANCELED|||pbatch|0.0|0.0|1709287000.0|0.0|-128|lode-x|a | b\n"
    scheduler, _ = flux(CommandResult(("flux",), 0, line, ""))
    [job] = scheduler.status().values()
    assert (job.name, job.reason) == ("lode-x", "a | b")


def test_status_by_id_asks_for_inactive_jobs_too() -> None:
    scheduler, runner = flux(result("flux", stdout="jobs.out"))
    assert set(scheduler.status(["3423288295424"])) == {"3423288295424"}
    assert runner.argvs[0][-2:] == ["-a", "3423288295424"]


def test_an_unknown_id_is_absent() -> None:
    scheduler, _ = flux(result("flux", stderr="jobs_unknown_id.err", returncode=1))
    assert scheduler.status(["1234"]) == {}


def test_accounting_ends_at_cleanup() -> None:
    scheduler, _ = flux(result("flux", stdout="jobs.out"))
    record = scheduler.accounting("3424966016000")
    assert record.state is SchedulerState.WALLTIME_EXPIRED
    assert record.start_time == datetime(2024, 3, 1, 9, 40, tzinfo=UTC)
    assert record.end_time == datetime(2024, 3, 1, 9, 41, 0, 200000, tzinfo=UTC)


def test_accounting_of_an_unknown_job() -> None:
    scheduler, _ = flux(result("flux", stderr="jobs_unknown_id.err", returncode=1))
    with pytest.raises(UnknownBatchJob):
        scheduler.accounting("1234")


def test_cancel() -> None:
    scheduler, runner = flux(
        CommandResult(("flux",), 0, "", ""),
        result("flux", stderr="cancel_inactive.err", returncode=1),
    )
    assert scheduler.delete("3422013227008") is True
    assert scheduler.delete("3423288295424") is False
    assert runner.argvs[0] == ["flux", "cancel", "3422013227008"]


def test_cancel_without_a_broker_is_an_error_not_a_gone_job() -> None:
    scheduler, _ = flux(result("flux", stderr="cancel_no_broker.err", returncode=1))
    with pytest.raises(SchedulerCommandFailed, match="Unable to connect to Flux"):
        scheduler.delete("3422013227008")


def test_no_backfill() -> None:
    scheduler, runner = flux()
    with pytest.raises(NotSupported):
        scheduler.backfill_windows()
    assert runner.calls == []
