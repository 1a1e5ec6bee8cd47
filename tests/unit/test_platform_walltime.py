"""Remaining wall time from each scheduler: parsers on captured output, and the dispatcher."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from lodestream.platform_adapters.compute import seconds_left
from lodestream.platform_adapters.compute.commands import run_command
from lodestream.platform_adapters.compute.machine import Scheduler
from lodestream.platform_adapters.compute.walltime import (
    FLUX_NO_LIMIT,
    parse_flux_timeleft,
    parse_lsf_time_left,
    parse_pbs_duration,
    parse_pbs_qstat,
    parse_slurm_time_left,
)
from lodestream.platform_adapters.errors import AllocationNotFound, SchedulerQueryFailed

DATA = Path(__file__).resolve().parents[1] / "data" / "schedulers"
NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1-02:03:04\n", 93784.0),
        ("12:00:00", 43200.0),
        ("1:00:00", 3600.0),
        ("59:30", 3570.0),
        ("0:05", 5.0),
        ("UNLIMITED\n", None),
    ],
)
def test_squeue_time_left(text: str, seconds: float | None) -> None:
    assert parse_slurm_time_left(text) == seconds


@pytest.mark.parametrize("text", ["INVALID", "NOT_SET", "", "1-2:3", "soon"])
def test_squeue_time_left_it_cannot_read(text: str) -> None:
    with pytest.raises(SchedulerQueryFailed, match="squeue"):
        parse_slurm_time_left(text)


def test_qstat_f_gives_the_limit_less_the_walltime_used() -> None:
    text = (DATA / "pbs_qstat_f.txt").read_text()
    # 01:00:00 less 00:12:34; the Variable_List continuation that mentions a walltime is no field
    assert parse_pbs_qstat(text) == 3600.0 - 754.0


def test_qstat_f_of_a_job_without_a_limit_or_not_yet_running() -> None:
    no_limit = "Job Id: 1.pbs\n    Job_Name = x\n    job_state = R\n"
    assert parse_pbs_qstat(no_limit) is None
    just_started = "Job Id: 1.pbs\n    Resource_List.walltime = 00:30:00\n"
    assert parse_pbs_qstat(just_started) == 1800.0
    overrun = (
        "Job Id: 1\n    Resource_List.walltime = 00:30:00\n    resources_used.walltime = 00:31:00\n"
    )
    assert parse_pbs_qstat(overrun) == 0.0
    with pytest.raises(SchedulerQueryFailed, match="not a job"):
        parse_pbs_qstat("qstat: Unknown Job Id 1.pbs\n")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("01:00:00", 3600.0), ("72:00:00", 259200.0), ("30:00", 1800.0), ("45", 45.0),
     ("00:00:01.5", 1.5)],
)  # fmt: skip
def test_pbs_durations(text: str, seconds: float) -> None:
    assert parse_pbs_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "1:2:3:4", "a:00", "-5"])
def test_pbs_durations_it_cannot_read(text: str) -> None:
    with pytest.raises(SchedulerQueryFailed):
        parse_pbs_duration(text)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0:59 L\n", 3540.0), ("12:30 E", 45000.0), ("00:59:30 L", 3570.0), ("1:00", 3600.0),
     ("-", None), ("", None)],
)  # fmt: skip
def test_bjobs_time_left(text: str, seconds: float | None) -> None:
    assert parse_lsf_time_left(text) == seconds


def test_bjobs_time_left_it_cannot_read() -> None:
    with pytest.raises(SchedulerQueryFailed, match="bjobs"):
        parse_lsf_time_left("in a while")


@pytest.mark.parametrize(
    ("text", "seconds"), [("3540\n", 3540.0), ("0", 0.0), (f"{FLUX_NO_LIMIT}\n", None)]
)
def test_flux_job_timeleft(text: str, seconds: float | None) -> None:
    assert parse_flux_timeleft(text) == seconds


def test_flux_job_timeleft_it_cannot_read() -> None:
    with pytest.raises(SchedulerQueryFailed):
        parse_flux_timeleft("1h")


class Runner:
    def __init__(self, outputs: dict[tuple[str, ...], str]) -> None:
        self.outputs = outputs
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str]) -> str:
        self.calls.append(tuple(argv))
        try:
            return self.outputs[tuple(argv)]
        except KeyError:
            raise SchedulerQueryFailed(f"{argv[0]} failed") from None


def left(
    scheduler: Scheduler, env: dict[str, str], outputs: dict[tuple[str, ...], str]
) -> float | None:
    return seconds_left(scheduler, environ=env, run=Runner(outputs), now=lambda: NOW)


def test_slurm_prefers_the_end_time_in_the_environment() -> None:
    env = {"SLURM_JOB_END_TIME": str(int(NOW) + 600), "SLURM_JOB_ID": "42"}
    assert left("slurm", env, {}) == 600.0


def test_slurm_asks_squeue_otherwise() -> None:
    runner = Runner({("squeue", "-h", "-j", "42", "-o", "%L"): "1:00:00\n"})
    assert seconds_left("slurm", environ={"SLURM_JOB_ID": "42"}, run=runner) == 3600.0
    assert runner.calls == [("squeue", "-h", "-j", "42", "-o", "%L")]


def test_pbs_asks_qstat_and_falls_back_to_pbs_walltime() -> None:
    qstat = (DATA / "pbs_qstat_f.txt").read_text()
    assert left("pbs", {"PBS_JOBID": "7.pbs"}, {("qstat", "-f", "7.pbs"): qstat}) == 2846.0
    assert left("pbs", {"PBS_JOBID": "7.pbs", "PBS_WALLTIME": "1800"}, {}) == 1800.0
    with pytest.raises(SchedulerQueryFailed):
        left("pbs", {"PBS_JOBID": "7.pbs"}, {})


def test_lsf_cobalt_flux_and_local() -> None:
    bjobs = ("bjobs", "-noheader", "-o", "time_left", "99")
    assert left("lsf", {"LSB_JOBID": "99"}, {bjobs: "1:30 L\n"}) == 5400.0
    assert left("cobalt", {"COBALT_ENDTIME": str(int(NOW) + 90)}, {}) == 90.0
    assert left("flux", {}, {("flux", "job", "timeleft"): "120\n"}) == 120.0
    assert left("flux", {}, {("flux", "job", "timeleft"): f"{FLUX_NO_LIMIT}\n"}) is None
    assert left("local", {}, {}) is None


def test_time_already_past_is_zero_not_negative() -> None:
    assert left("cobalt", {"COBALT_ENDTIME": str(int(NOW) - 90)}, {}) == 0.0


@pytest.mark.parametrize(
    ("scheduler", "variable"),
    [("slurm", "SLURM_JOB_ID"), ("pbs", "PBS_JOBID"), ("lsf", "LSB_JOBID"),
     ("cobalt", "COBALT_ENDTIME")],
)  # fmt: skip
def test_outside_a_job_there_is_no_allocation(scheduler: Scheduler, variable: str) -> None:
    with pytest.raises(AllocationNotFound, match=variable):
        left(scheduler, {}, {})


def test_bad_end_times_are_refused() -> None:
    with pytest.raises(SchedulerQueryFailed, match="COBALT_ENDTIME"):
        left("cobalt", {"COBALT_ENDTIME": "tomorrow"}, {})
    with pytest.raises(SchedulerQueryFailed, match="SLURM_JOB_END_TIME"):
        left("slurm", {"SLURM_JOB_END_TIME": "0"}, {})


def test_the_default_runner_maps_failures() -> None:
    assert run_command(["echo", "3600"]) == "3600\n"
    with pytest.raises(SchedulerQueryFailed, match="not found on PATH"):
        run_command(["no-such-scheduler-command"])
    with pytest.raises(SchedulerQueryFailed, match="exited with 3: oops"):
        run_command(["sh", "-c", "echo oops >&2; exit 3"])
    with pytest.raises(SchedulerQueryFailed, match="no answer"):
        run_command(["sleep", "5"], timeout_s=0.1)
