"""What every scheduler adapter shares: the command runner, requests, times, host lists,
windows, the state tables and the registry."""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from lodestream.platform_adapters.compute.hostlist import expand_hostlist
from lodestream.platform_adapters.errors import (
    InvalidJobId,
    InvalidSubmission,
    SchedulerCommandFailed,
    SchedulerTimeout,
    SchedulerUnavailable,
    UnknownBackend,
)
from lodestream.platform_adapters.schedulers import (
    BackfillWindow,
    BatchRequest,
    LocalScheduler,
    SlurmScheduler,
    get_scheduler,
    run_command,
    scheduler_names,
)
from lodestream.platform_adapters.schedulers.base import check_job_id
from lodestream.platform_adapters.schedulers.cobalt import COBALT_STATES
from lodestream.platform_adapters.schedulers.flux import FLUX_STATES
from lodestream.platform_adapters.schedulers.lsf import LSF_EXIT_REASONS, LSF_STATES
from lodestream.platform_adapters.schedulers.parsing import map_state
from lodestream.platform_adapters.schedulers.pbs import PBS_FINISH_BY_SUBSTATE, PBS_STATES
from lodestream.platform_adapters.schedulers.runner import CommandResult, require_success
from lodestream.platform_adapters.schedulers.slurm import SLURM_STATES
from lodestream.platform_adapters.schedulers.timeparse import duration_s, localize
from lodestream.platform_adapters.schedulers.windows import windows_from_free_nodes
from lodestream.schemas.resources import (
    BATCH_STATE_FOR_SCHEDULER_STATE,
    FINAL_SCHEDULER_STATES,
    BatchJobState,
    SchedulerState,
)
from tests.support.scheduler_runner import ScriptedRunner

# The states each scheduler documents (squeue(1) JOB STATE CODES, PBS job_state, bjobs(1)
# STAT, Cobalt's qstat, flux-jobs(1) JOB STATUS old and new): every one must be in its table.
DOCUMENTED = {
    "slurm": (SLURM_STATES, {
        "BOOT_FAIL", "CANCELLED", "COMPLETED", "CONFIGURING", "COMPLETING", "DEADLINE",
        "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PENDING", "PREEMPTED", "RUNNING",
        "RESV_DEL_HOLD", "REQUEUE_FED", "REQUEUE_HOLD", "REQUEUED", "RESIZING", "REVOKED",
        "SIGNALING", "SPECIAL_EXIT", "STAGE_OUT", "STOPPED", "SUSPENDED", "TIMEOUT",
    }),
    "pbs": (PBS_STATES, set("BEFHMQRSTUWX")),
    "lsf": (LSF_STATES, {
        "PEND", "PROV", "PSUSP", "RUN", "USUSP", "SSUSP", "DONE", "EXIT", "UNKWN", "WAIT",
        "ZOMBI",
    }),
    "cobalt": (COBALT_STATES, {
        "queued", "starting", "running", "exiting", "killing", "user_hold", "admin_hold",
        "dep_hold", "maxrun_hold", "dep_fail",
    }),
    "flux": (FLUX_STATES, {
        "DEPEND", "PRIORITY", "SCHED", "RUN", "CLEANUP", "PENDING", "RUNNING", "COMPLETED",
        "FAILED", "CANCELED", "TIMEOUT",
    }),
}  # fmt: skip


@pytest.mark.parametrize("scheduler", sorted(DOCUMENTED))
def test_every_documented_native_state_maps(scheduler: str) -> None:
    table, documented = DOCUMENTED[scheduler]
    assert documented <= set(table), f"{scheduler}: unmapped {documented - set(table)}"
    assert all(isinstance(state, SchedulerState) for state in table.values())


def test_wall_time_expiry_is_its_own_state_everywhere() -> None:
    assert SLURM_STATES["TIMEOUT"] is SchedulerState.WALLTIME_EXPIRED
    assert FLUX_STATES["TIMEOUT"] is SchedulerState.WALLTIME_EXPIRED
    assert LSF_EXIT_REASONS["TERM_RUNLIMIT"] is SchedulerState.WALLTIME_EXPIRED
    assert PBS_FINISH_BY_SUBSTATE[91] is SchedulerState.CANCELLED


def test_an_unknown_native_state_is_unknown_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert map_state(SLURM_STATES, "WIBBLE", "slurm") is SchedulerState.UNKNOWN
    assert "WIBBLE" in caplog.text


def test_every_scheduler_state_has_a_batch_event_or_none() -> None:
    assert set(BATCH_STATE_FOR_SCHEDULER_STATE) == set(SchedulerState)
    for state in FINAL_SCHEDULER_STATES:
        assert BATCH_STATE_FOR_SCHEDULER_STATE[state] is BatchJobState.FINISHED
    assert SchedulerState.UNKNOWN not in FINAL_SCHEDULER_STATES


def test_a_missing_command_is_named() -> None:
    with pytest.raises(SchedulerUnavailable, match="'sbatch-that-is-not-here' not found"):
        run_command(["sbatch-that-is-not-here", "x.sh"], timeout_s=5)


def test_a_hanging_command_times_out() -> None:
    with pytest.raises(SchedulerTimeout, match=r"did not finish within 0\.2 s"):
        run_command([sys.executable, "-c", "import time; time.sleep(10)"], timeout_s=0.2)


def test_a_failing_command_is_returned_with_its_words(tmp_path: Path) -> None:
    done = run_command(
        [sys.executable, "-c", "import os, sys; sys.stderr.write(os.environ['X']); sys.exit(3)"],
        timeout_s=10,
        env={"X": "no such queue"},
        cwd=tmp_path,
    )
    assert (done.returncode, done.stderr) == (3, "no such queue")
    with pytest.raises(SchedulerCommandFailed, match="exited 3: no such queue") as caught:
        require_success(done)
    assert caught.value.returncode == 3


def test_a_missing_working_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(SchedulerUnavailable, match="no directory"):
        run_command(["true"], timeout_s=5, cwd=tmp_path / "gone")


def test_stdout_is_quoted_when_stderr_is_empty() -> None:
    failed = CommandResult(("qdel",), 1, "it went wrong\n", "")
    with pytest.raises(SchedulerCommandFailed, match="qdel exited 1: it went wrong"):
        require_success(failed)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"nodes": 0}, "nodes"),
        ({"wall_time_min": 0}, "wall_time_min"),
        ({"project": "-A evil"}, "project"),
        ({"queue": "two words"}, "queue"),
        ({"job_name": "a\nrm -rf ~"}, "job_name"),
        ({"options": {"--evil": "x"}}, "option name"),
        ({"options": {"evil\n": "x"}}, "option name"),
        ({"options": {"constraint": "a\nb"}}, "option constraint"),
        ({"options": {"comment": "x --export=ALL,BASH_ENV=$(id)"}}, "option comment 'x --"),
        ({"options": {"mail-user": "-x"}}, "starts with '-'"),
        ({"queue": "debug#x"}, "'#' is not one of"),
        ({"extra_args": ("ok", "not\nok")}, "line break"),
        ({"env": {"1BAD": "x"}}, "environment name"),
        ({"env": {"OK": "a\x00b"}}, "NUL"),
    ],
)
def test_a_malformed_request_is_refused(bad: dict[str, object], message: str) -> None:
    kwargs: dict[str, object] = {"wall_time_min": 10, **bad}
    with pytest.raises(InvalidSubmission, match=message):
        BatchRequest(**kwargs)  # type: ignore[arg-type]


def test_a_request_does_not_change_with_the_callers_dict() -> None:
    options = {"constraint": "gpu"}
    request = BatchRequest(wall_time_min=10, options=options)
    options["constraint"] = "cpu"
    assert request.options == {"constraint": "gpu"}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1-02:03:04", 93784),
        ("2-00:00:00", 172800),
        ("1-02", 93600),
        ("02:03:04", 7384),
        ("12:34", 754),
        ("30", 1800),
        ("0:00", 0),
        ("UNLIMITED", None),
        ("infinite", None),
        ("N/A", None),
        ("", None),
    ],
)
def test_durations(text: str, seconds: int | None) -> None:
    assert duration_s(text) == seconds


@pytest.mark.parametrize("text", ["1:2:3:4", "ten", "1-1:2:3:4", "-5"])
def test_malformed_durations(text: str) -> None:
    with pytest.raises(ValueError, match=r"malformed|whole number"):
        duration_s(text)


def test_local_times_in_a_zone_with_dst() -> None:
    chicago = ZoneInfo("America/Chicago")
    assert localize(datetime(2024, 1, 15, 12, 0), chicago) == datetime(  # noqa: DTZ001
        2024, 1, 15, 18, 0, tzinfo=UTC
    )
    assert localize(datetime(2024, 7, 15, 12, 0), chicago) == datetime(  # noqa: DTZ001
        2024, 7, 15, 17, 0, tzinfo=UTC
    )


def test_local_times_default_to_this_hosts_zone() -> None:
    naive = datetime(2024, 7, 15, 12, 0, 0, 250000)  # noqa: DTZ001
    assert localize(naive, None) == naive.astimezone(UTC)


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("nid[001-003]", ("nid001", "nid002", "nid003")),
        ("nid[08-10],login1", ("nid08", "nid09", "nid10", "login1")),
        ("n[1,3-4]", ("n1", "n3", "n4")),
        ("r[1-2]n[1-2]", ("r1n1", "r1n2", "r2n1", "r2n2")),
        ("x3005c0s13b0n0", ("x3005c0s13b0n0",)),
        ("", ()),
        ("(null)", ()),
    ],
)
def test_host_lists(text: str, hosts: tuple[str, ...]) -> None:
    assert tuple(expand_hostlist(text)) == hosts


@pytest.mark.parametrize("text", ["nid[001-", "nid]1[", "n[a-b]", "n[5-1]", "a,,b", "n[[1]]"])
def test_malformed_host_lists(text: str) -> None:
    with pytest.raises(ValueError, match=r"host ?list|range"):
        expand_hostlist(text)


def test_a_huge_range_is_refused() -> None:
    with pytest.raises(ValueError, match=r"range|more than"):
        expand_hostlist("n[0-99999999]")


def test_windows_are_cumulative_longest_first() -> None:
    free = [("debug", 30), ("debug", 30), ("debug", 10), ("debug", None), ("batch", 5), ("x", 0)]
    assert windows_from_free_nodes(free) == [
        BackfillWindow(queue="batch", nodes=1, minutes=5),
        BackfillWindow(queue="debug", nodes=1, minutes=None),
        BackfillWindow(queue="debug", nodes=3, minutes=30),
        BackfillWindow(queue="debug", nodes=4, minutes=10),
    ]


def test_registry(tmp_path: Path) -> None:
    assert scheduler_names() == ("cobalt", "fake", "flux", "local", "lsf", "pbs", "slurm")
    assert isinstance(get_scheduler("slurm", jobcomp_path=tmp_path / "log"), SlurmScheduler)
    assert isinstance(get_scheduler("local", tmp_path), LocalScheduler)
    with pytest.raises(UnknownBackend, match="known: cobalt, fake, flux"):
        get_scheduler("sge")


@pytest.mark.parametrize("bad", ["-u alice", "--me", "", "42 43", "42\n"])
def test_an_id_that_would_read_as_an_option_never_reaches_a_command(bad: str) -> None:
    runner = ScriptedRunner([])
    scheduler = SlurmScheduler(runner=runner, user="alice")
    with pytest.raises(InvalidJobId):
        scheduler.status([bad])
    with pytest.raises(InvalidJobId):
        scheduler.delete(bad)
    with pytest.raises(InvalidJobId):
        scheduler.accounting(bad)
    assert runner.calls == []


@pytest.mark.parametrize("good", ["4242", "4242_7", "8123.polaris-pbs-01.hsn", "123[].pbs01"])
def test_real_ids_pass(good: str) -> None:
    assert check_job_id(good) == good
