"""A pilot stopped by Slurm while a job runs: the job times out with the cause chain and runs
again, on the real test cluster (tests/fixtures/slurm.py).

``lode queue rm`` is an ``scancel``, which signals the job's steps at the same moment as the
pilot: the task (``srun``'s step, or Hydra's ``mpiexec``) may die before the pilot has even
been told, and it was recorded as ``job.run_errored`` (143 with srun, 255 with mpiexec),
spending the job's retry budget. Slurm enforcing a time limit shorter than the pilot was
told meets the same race. Each test checks the job's raw events, and the batch job against
Slurm's own record (``jobcomp/filetxt``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lodestream.agents.site.settings import LauncherSettings
from lodestream.infra.postgres.server import EmbeddedPostgres
from tests.fixtures.slurm import SlurmCluster
from tests.integration.test_platform_mpi import MPIEXEC
from tests.integration.test_slurm_pilots import SLOW_FIRST
from tests.support.slurm_site import (
    SITE,
    SlurmSite,
    batch_in,
    running_slurm_site,
    until,
)

pytestmark = pytest.mark.slow

# (mode, app launcher): serial jobs through srun (generic-slurm's), and through pip MPICH's
# Hydra mpiexec in mpi mode, which starts its proxies with srun inside the allocation.
LAUNCHERS = [
    pytest.param("serial", "srun", id="srun"),
    pytest.param(
        "mpi", "mpich", id="mpiexec",
        marks=pytest.mark.skipif(MPIEXEC is None, reason="needs MPICH's mpiexec (pip mpich)"),
    ),
]  # fmt: skip


@pytest.fixture(scope="module")
def stop_site(
    slurm_cluster: SlurmCluster,
    tmp_path_factory: pytest.TempPathFactory,
    postgres_server: EmbeddedPostgres,
) -> Iterator[SlurmSite]:
    root = tmp_path_factory.mktemp("slurm-stops")
    path = os.environ.get("PATH", os.defpath)
    if MPIEXEC is not None:
        path = os.pathsep.join([str(Path(MPIEXEC).parent), path])
    with running_slurm_site(
        slurm_cluster, root, postgres_server, agent_env={"PATH": path},
        apps={"slowfirst.py": SLOW_FIRST}, app_names=("slowfirst",),
    ) as site:  # fmt: skip
        yield site


@pytest.fixture
def site(stop_site: SlurmSite) -> Iterator[SlurmSite]:
    yield stop_site
    stop_site.slurm.cancel_all()


def use(site: SlurmSite, mode: str, app_launcher: str) -> None:
    launcher = LauncherSettings.model_validate(
        site.settings.launcher.model_dump() | {"mode": mode, "app_launcher": app_launcher}
    )
    site.write_settings(launcher=launcher)


def started_job(site: SlurmSite, workdir: str, mode: str) -> tuple[str, str, dict[str, Any]]:
    """A job that runs for ten minutes on its first attempt, its pilot's batch job, and the
    batch job once it runs the job (the task itself up: it wrote its workdir's ``up``)."""
    command = {"site": SITE, "app": "slowfirst", "workdir": workdir,
               "parameters": {"seconds": "600"}}  # fmt: skip
    [job] = [j["id"] for j in site.client.submit_jobs([command])["jobs"]]
    batch = site.submit_pilot("--wall-time-min", "5", "--mode", mode)
    running = until("the pilot's batch job runs", lambda: batch_in(site, batch, "running"), site)
    until("the pilot started the job",
          lambda: site.client.get_job(job)["state"] == "RUNNING", site)  # fmt: skip
    return job, batch, running


def run_ends(site: SlurmSite, job: str) -> list[dict[str, Any]]:
    return [e for e in site.client.job_events(job)
            if e["type"] in {"job.run_errored", "job.run_timed_out", "job.run_done",
                             "job.finished"}]  # fmt: skip


def session_of(site: SlurmSite, job: str) -> str:
    [session] = [e["data"]["session_id"] for e in site.client.job_events(job)
                 if e["type"] == "job.started"]  # fmt: skip
    return str(session)


@pytest.mark.parametrize(("mode", "app_launcher"), LAUNCHERS)
def test_a_job_under_a_pilot_removed_with_lode_queue_rm_times_out_and_runs_again(
    site: SlurmSite, mode: str, app_launcher: str
) -> None:
    use(site, mode, app_launcher)
    job, batch, running = started_job(site, f"rm/{app_launcher}", mode)

    assert site.lode("queue", "rm", batch).strip() == f"{batch}: deletion_requested"

    ended = until("the deleted batch job ended", lambda: batch_in(site, batch, "finished"), site)
    until("the job is ready to run again",
          lambda: site.client.get_job(job)["state"] == "RESTART_READY", site)  # fmt: skip
    [end] = run_ends(site, job)
    assert end["type"] == "job.run_timed_out", end
    scheduler_id = running["scheduler_id"]
    assert end["data"]["cause"][-2:] == [
        f"launcher {session_of(site, job)} drained: stopped",
        f"batch job {batch} (slurm {scheduler_id}): told to stop (deleted, preempted or shut down)",
    ]
    assert [e["type"] for e in site.client.job_events(job)][-2:] == [
        "job.run_timed_out", "job.restart_ready",
    ]  # fmt: skip
    # Slurm's own record: the batch job was cancelled, and lodestream says so too.
    assert ended["scheduler_state"] == "cancelled"
    assert site.slurm.jobcomp()[scheduler_id]["JobState"] == "CANCELLED"


def test_a_job_under_a_pilot_slurm_ends_at_its_time_limit_times_out_and_runs_again(
    site: SlurmSite,
) -> None:
    """The pilot was told 5 minutes, Slurm's limit is cut to one: Slurm's SIGTERM, not the
    pilot's own deadline, ends the job's step and the pilot at once."""
    use(site, "serial", "srun")
    job, batch, running = started_job(site, "limit", "serial")
    scheduler_id = running["scheduler_id"]
    site.slurm.run("scontrol", "update", f"JobId={scheduler_id}", "TimeLimit=1")

    ended = until("Slurm ended the batch job at its time limit",
                  lambda: batch_in(site, batch, "finished"), site, timeout_s=180)  # fmt: skip
    until("the job is ready to run again",
          lambda: site.client.get_job(job)["state"] == "RESTART_READY", site)  # fmt: skip
    [end] = run_ends(site, job)
    assert end["type"] == "job.run_timed_out", end
    assert end["data"]["cause"][-2] == f"launcher {session_of(site, job)} drained: stopped"
    assert end["data"]["cause"][-1].startswith(f"batch job {batch} (slurm {scheduler_id}): ")
    assert ended["scheduler_state"] == "walltime_expired"
    record = site.slurm.jobcomp()[scheduler_id]
    assert (record["JobState"], record["TimeLimit"]) == ("TIMEOUT", "1")
