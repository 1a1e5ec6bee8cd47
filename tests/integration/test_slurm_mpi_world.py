"""No MPI job runs as separate programs: srun's PMI plugin and the pilot's probe of its MPI
world, on the real test cluster (tests/fixtures/slurm.py, whose ``MpiDefault`` is none).

The site is in mpi mode with ``generic-slurm``'s own launcher, ``srun``, and, unlike
``test_slurm_mpi.py``, its job template sets no ``SLURM_MPI_TYPE``: what the machine
description says (``srun_mpi: pmi2``) is all that makes a world. With it a 4-rank mpi4py job
is one world of 4. With ``launcher.srun_mpi: default`` (no ``--mpi``: the cluster's none) each
rank would be a world of one: the pilot's 2-rank probe finds that at its start, and the pilot
fails MPI jobs with the reason on their history, without running them, while it still runs
serial ones.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from lodestream.agents.site.settings import LauncherSettings
from lodestream.infra.postgres.server import EmbeddedPostgres
from tests.fixtures.slurm import SlurmCluster
from tests.integration.test_platform_mpi import MPIEXEC
from tests.integration.test_slurm_mpi import APPS, REPO, ranks_written
from tests.support.slurm_site import SITE, SlurmSite, jobs_in, running_slurm_site, until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        MPIEXEC is None or importlib.util.find_spec("mpi4py") is None,
        reason="needs MPICH and mpi4py beside this interpreter (pip install mpich mpi4py)",
    ),
]


@pytest.fixture(scope="module")
def world_site(
    slurm_cluster: SlurmCluster,
    tmp_path_factory: pytest.TempPathFactory,
    postgres_server: EmbeddedPostgres,
) -> Iterator[SlurmSite]:
    assert MPIEXEC is not None
    root = tmp_path_factory.mktemp("slurm-mpi-world")
    path = os.pathsep.join([str(Path(MPIEXEC).parent), os.environ.get("PATH", os.defpath)])
    with running_slurm_site(
        slurm_cluster, root, postgres_server,
        scheduler={"options": {"exclusive": ""}},
        agent_env={"PATH": path, "PYTHONPATH": str(REPO)},
        apps={"mpi.py": APPS}, app_names=("mpi_where", "hello"), mode="mpi",
    ) as site:  # fmt: skip
        assert "SLURM_MPI_TYPE" not in (site.site_dir / "job-template.sh").read_text()
        yield site


@pytest.fixture
def site(world_site: SlurmSite) -> Iterator[SlurmSite]:
    yield world_site
    world_site.slurm.cancel_all()


def use_srun_mpi(site: SlurmSite, srun_mpi: str | None) -> None:
    launcher = LauncherSettings.model_validate(
        site.settings.launcher.model_dump() | {"srun_mpi": srun_mpi, "app_launcher": None}
    )
    written = site.write_settings(launcher=launcher).launcher
    assert (written.mode, written.srun_mpi) == ("mpi", srun_mpi)


def test_the_machines_pmi_plugin_makes_four_ranks_one_world(site: SlurmSite) -> None:
    use_srun_mpi(site, None)  # generic-slurm's srun_mpi: pmi2
    [job] = [j["id"] for j in site.client.submit_jobs([
        {"site": SITE, "app": "mpi_where", "workdir": "world/four", "num_nodes": 2,
         "ranks_per_node": 2},
    ])["jobs"]]  # fmt: skip
    site.submit_pilot("--num-nodes", "2", "--wall-time-min", "5", "--mode", "mpi")

    until("the MPI job finished", lambda: jobs_in(site, [job], "JOB_FINISHED"), site, 180)
    ranks = ranks_written(site, "world/four")
    assert [(r["rank"], r["size"]) for r in ranks] == [(r, 4) for r in range(4)]
    assert {r["starter"] for r in ranks} == {"slurmstepd"}


def test_a_pilot_whose_srun_starts_no_world_fails_mpi_jobs_and_runs_serial_ones(
    site: SlurmSite,
) -> None:
    use_srun_mpi(site, "default")  # no --mpi: this cluster's MpiDefault, none
    mpi, serial = [j["id"] for j in site.client.submit_jobs([
        {"site": SITE, "app": "mpi_where", "workdir": "broken/mpi", "num_nodes": 2,
         "ranks_per_node": 2},
        {"site": SITE, "app": "hello", "workdir": "broken/serial"},
    ])["jobs"]]  # fmt: skip
    site.submit_pilot("--num-nodes", "2", "--wall-time-min", "5", "--mode", "mpi")

    until("the serial job finished", lambda: jobs_in(site, [serial], "JOB_FINISHED"), site, 180)
    until("the MPI job failed", lambda: jobs_in(site, [mpi], "FAILED"), site, 180)
    events = site.client.job_events(mpi)
    errors = [e["data"] for e in events if e["type"] == "job.run_errored"]
    assert errors, events
    for error in errors:  # every attempt refused with the reason, none of them run
        assert error["cause"] == ["cannot run at this site"]
        assert "an MPI job (2 nodes x 2 ranks)" in error["stderr_tail"]
        assert "does not start the ranks of a job as one MPI world" in error["stderr_tail"]
        assert "found no process manager" in error["stderr_tail"]
        assert "launcher.srun_mpi" in error["stderr_tail"]
    started = [e["data"]["placement"] for e in events if e["type"] == "job.started"]
    assert started
    assert all(p == [] for p in started)  # leased only to say why, on no node
    assert ranks_written(site, "broken/mpi") == []
    shown = site.lode("job", "show", mpi)
    assert "does not start the ranks of a job as one MPI world" in shown, shown
