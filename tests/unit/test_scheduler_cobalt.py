"""The Cobalt adapter over captured qsub / qstat / qdel / nodelist output."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from lodestream.agents.site.scheduler.decide import find_submitted
from lodestream.platform_adapters.errors import (
    InvalidSubmission,
    NotSupported,
    SubmitRejected,
    UnparseableOutput,
)
from lodestream.platform_adapters.schedulers import BackfillWindow, BatchRequest, CobaltScheduler
from lodestream.platform_adapters.schedulers.cobalt import (
    render_cobalt_header,
    render_qsub_argv,
)
from lodestream.platform_adapters.schedulers.runner import CommandResult
from lodestream.schemas.resources import SchedulerState
from tests.support.scheduler_runner import ScriptedRunner, result

SCRIPT = Path("/home/alice/site/batch/pilot-01.sh")
REQUEST = BatchRequest(
    project="datascience",
    queue="debug-cache-quad",
    nodes=8,
    wall_time_min=30,
    options={"attrs": "mcdram=cache:numa=quad"},
    env={"LODE_SITE": "theta", "OMP_NUM_THREADS": "64"},
)


def cobalt(*replies: CommandResult) -> tuple[CobaltScheduler, ScriptedRunner]:
    runner = ScriptedRunner(list(replies))
    return CobaltScheduler(runner=runner, user="alice"), runner


def test_qsub_argv() -> None:
    assert render_qsub_argv(SCRIPT, REQUEST) == [
        "qsub",
        "-A", "datascience",
        "-q", "debug-cache-quad",
        "-n", "8",
        "-t", "30",
        "--attrs", "mcdram=cache:numa=quad",
        "-O", "/home/alice/site/batch/pilot-01",
        "--env", "LODE_SITE=theta:OMP_NUM_THREADS=64",
        "/home/alice/site/batch/pilot-01.sh",
    ]  # fmt: skip


def test_a_colon_in_an_environment_value_is_refused_not_split() -> None:
    request = BatchRequest(wall_time_min=5, env={"PATH": "/bin:/usr/bin"})
    with pytest.raises(InvalidSubmission, match="PATH"):
        render_qsub_argv(SCRIPT, request)


def test_cobalt_header() -> None:
    assert render_cobalt_header(REQUEST) == (
        "#COBALT -A datascience\n"
        "#COBALT -q debug-cache-quad\n"
        "#COBALT -n 8\n"
        "#COBALT -t 30\n"
        "#COBALT --attrs mcdram=cache:numa=quad\n"
    )


def test_submit_reads_the_id_after_the_routing_chatter() -> None:
    scheduler, runner = cobalt(result("cobalt", stdout="qsub.out"))
    assert scheduler.submit(SCRIPT, wall_time_min=10) == "349832"
    assert runner.calls[0].cwd == SCRIPT.parent


def test_a_refused_submission() -> None:
    scheduler, _ = cobalt(result("cobalt", stderr="qsub_bad_project.err", returncode=1))
    with pytest.raises(SubmitRejected, match="Projects available"):
        scheduler.submit(SCRIPT, wall_time_min=10, project="placeholder_null")


def test_qstat_with_its_header_chosen(caplog: pytest.LogCaptureFixture) -> None:
    scheduler, runner = cobalt(result("cobalt", stdout="qstat.out"))
    with caplog.at_level(logging.WARNING):
        jobs = scheduler.status()
    assert runner.argvs == [["qstat", "-u", "alice"]]
    assert runner.calls[0].env == {
        "QSTAT_HEADER": "JobID:State:Nodes:Queue:WallTime:RunTime:Location:JobName"
    }
    assert {k: v.state for k, v in jobs.items()} == {
        "349830": SchedulerState.RUNNING,
        "349831": SchedulerState.QUEUED,
        "349832": SchedulerState.QUEUED,
        "349833": SchedulerState.RUNNING,
    }
    assert jobs["349830"].elapsed_s == 4353
    assert jobs["349830"].wall_time_min == 180
    assert jobs["349831"].elapsed_s is None
    assert "349834" in caplog.text


def test_qstat_shows_each_jobs_name() -> None:
    scheduler, _ = cobalt(result("cobalt", stdout="qstat.out"))
    jobs = scheduler.status()
    assert {k: v.name for k, v in jobs.items()} == {
        "349830": "lode-2d6f0b3e-91a4-4c7d-8e25-f3b1a0c69d48",
        "349831": "lode-a81e4c07-3b9d-42f6-b0e5-7c2d19f8a364",
        "349832": "",  # N/A: submitted without --jobname
        "349833": "mesh sweep 2",  # the last column: spaces and all
    }
    # A submission whose id was lost (qsub hung after queueing it) is found by that name.
    batch = uuid.UUID("a81e4c07-3b9d-42f6-b0e5-7c2d19f8a364")
    assert find_submitted(jobs, batch) == "349831"
    assert find_submitted(jobs, uuid.uuid4()) is None


def test_qsub_gives_the_job_its_name() -> None:
    request = BatchRequest(wall_time_min=5, job_name="lode-a81e4c07-3b9d-42f6-b0e5-7c2d19f8a364")
    argv = render_qsub_argv(SCRIPT, request)
    assert argv[argv.index("--jobname") + 1] == request.job_name
    assert f"#COBALT --jobname {request.job_name}\n" in render_cobalt_header(request)


def test_an_empty_queue_prints_nothing() -> None:
    scheduler, _ = cobalt(result("cobalt", stdout="qstat_empty.out"))
    assert scheduler.status() == {}


def test_qstat_without_its_header_is_unparseable() -> None:
    scheduler, _ = cobalt(CommandResult(("qstat",), 0, "349830 running 128\n", ""))
    with pytest.raises(UnparseableOutput, match="JobID"):
        scheduler.status()


def test_qdel() -> None:
    scheduler, _ = cobalt(
        result("cobalt", stdout="qdel.out"), result("cobalt", stdout="qdel_nothing.out")
    )
    assert scheduler.delete("349832") is True
    assert scheduler.delete("349899") is False


def test_nodelist_windows(caplog: pytest.LogCaptureFixture) -> None:
    scheduler, _ = cobalt(result("cobalt", stdout="nodelist.out"))
    with caplog.at_level(logging.WARNING):
        windows = scheduler.backfill_windows()
    # Idle nodes with a backfill time; 30 s is no window; "-" is not one either.
    assert windows == [
        BackfillWindow(queue="backfill", nodes=2, minutes=90),
        BackfillWindow(queue="default", nodes=2, minutes=90),
        BackfillWindow(queue="default", nodes=3, minutes=20),
    ]
    assert "3841" in caplog.text


def test_no_accounting() -> None:
    scheduler, runner = cobalt()
    assert not scheduler.capabilities.accounting
    with pytest.raises(NotSupported):
        scheduler.accounting("349832")
    assert runner.calls == []
