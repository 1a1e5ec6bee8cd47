"""MPI jobs inside a Slurm allocation: mpi-mode pilots on the real test cluster
(tests/fixtures/slurm.py), with pip's MPICH and mpi4py.

The site is set up as its user would: ``launcher.mode: mpi`` with machine ``generic-slurm``
(nodes from ``SLURM_JOB_NODELIST``), pilots asked for with ``lode queue submit --mode mpi``
and submitted by the site agent with ``sbatch`` for whole nodes (``scheduler.options:
{exclusive: ""}``, as most clusters give them anyway), and the site's job template exporting
``SLURM_MPI_TYPE=pmi2``: the cluster's ``MpiDefault`` is ``none``, and pip's MPICH speaks
PMI-2, not PMIx. One pilot per app launcher — ``mpich`` (Hydra's ``mpiexec``, which starts
its proxies with ``srun`` inside the allocation) and ``srun`` (``srun --mpi=pmi2``) — each in a
3-node allocation running two mpi4py jobs: two ranks on one node, and one rank on each of two
nodes. Every rank writes its rank, the size of its world, the host it runs on, the Slurm
node it was started on (``SLURMD_NODENAME``: the test's three nodes are all this host) and
the process that started it.

Skipped where there is no Hydra ``mpiexec`` or no mpi4py beside the interpreter.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import lodestream
from lodestream.agents.site.settings import LauncherSettings
from lodestream.infra.postgres.server import EmbeddedPostgres
from tests.fixtures.slurm import NODES, SlurmCluster
from tests.integration.test_platform_mpi import MPIEXEC
from tests.support.slurm_site import (
    SITE,
    SlurmSite,
    batch_in,
    jobs_in,
    running_slurm_site,
    until,
)

pytestmark = pytest.mark.skipif(
    MPIEXEC is None or importlib.util.find_spec("mpi4py") is None,
    reason="needs MPICH's mpiexec and mpi4py beside this interpreter (pip install mpich mpi4py)",
)

REPO = Path(lodestream.__file__).resolve().parent.parent
# What starts a rank: Hydra's proxy (itself started by srun) for mpich, slurmstepd for srun.
STARTER = {"mpich": "hydra_pmi_proxy", "srun": "slurmstepd"}
APPS = """
from lodestream.agents.site.apps import ApplicationDefinition


class MpiWhere(ApplicationDefinition):
    \"\"\"Each rank says who it is, where it runs and what started it, on stdout and in a file
    of its own.\"\"\"

    name = "mpi_where"
    command_template = (
        "STARTER=$(cat /proc/$PPID/comm) PYTHON -c '"
        "import os, socket; from mpi4py import MPI; c = MPI.COMM_WORLD; "
        "line = \\"%d %d %s %s %s\\" % (c.rank, c.size, socket.gethostname(), "
        "os.environ.get(\\"SLURMD_NODENAME\\", \\"-\\"), os.environ[\\"STARTER\\"]); "
        "print(line, flush=True); open(\\"rank%d.txt\\" % c.rank, \\"w\\").write(line)'"
    )


class Meet(ApplicationDefinition):
    \"\"\"Every rank says it is here and waits (30 s at most) until the other job's ranks are.\"\"\"

    name = "meet"
    command_template = (
        "touch ../{{ me }}.$$; for i in $(seq 300); do "
        "ls ../{{ other }}.* >/dev/null 2>&1 && exit 0; sleep 0.1; done; "
        "echo {{ other }} never came >&2; exit 1"
    )
""".replace("PYTHON", sys.executable)
# The site's job template, with what its MPI needs above the pilot's start.
PMI2 = "export SLURM_MPI_TYPE=pmi2  # pip's MPICH speaks PMI-2; this cluster's default is none\n"


@pytest.fixture(scope="module")
def mpi_site(
    slurm_cluster: SlurmCluster,
    tmp_path_factory: pytest.TempPathFactory,
    postgres_server: EmbeddedPostgres,
) -> Iterator[SlurmSite]:
    assert MPIEXEC is not None
    root = tmp_path_factory.mktemp("slurm-mpi")
    # pip's mpiexec (and Hydra's proxy) sit beside this interpreter; the ranks' Python
    # imports this checkout.
    path = os.pathsep.join([str(Path(MPIEXEC).parent), os.environ.get("PATH", os.defpath)])
    with running_slurm_site(
        slurm_cluster, root, postgres_server,
        scheduler={"options": {"exclusive": ""}},
        agent_env={"PATH": path, "PYTHONPATH": str(REPO)},
        apps={"mpi.py": APPS}, app_names=("mpi_where", "meet"),
        mode="mpi", app_launcher="mpich",
    ) as site:  # fmt: skip
        template = site.site_dir / "job-template.sh"
        body = template.read_text()
        template.write_text(body.replace("set -eu\n", f"set -eu\n{PMI2}", 1))
        yield site


@pytest.fixture
def site(mpi_site: SlurmSite) -> Iterator[SlurmSite]:
    yield mpi_site
    mpi_site.slurm.cancel_all()


def ranks_written(site: SlurmSite, workdir: str) -> list[dict[str, Any]]:
    """What each rank of the job in ``workdir`` wrote, in rank order."""
    found = []
    for path in sorted((site.site_dir / "data" / workdir).glob("rank*.txt")):
        rank, size, host, node, starter = path.read_text().split()
        found.append({"rank": int(rank), "size": int(size), "host": host, "node": node,
                      "starter": starter})  # fmt: skip
    return found


def placements(site: SlurmSite, job: str) -> list[list[str]]:
    """The hostnames of the placement of each ``job.started`` of ``job``."""
    return [
        [p["hostname"] for p in event["data"]["placement"]]
        for event in site.client.job_events(job)
        if event["type"] == "job.started"
    ]


def use_app_launcher(site: SlurmSite, name: str) -> None:
    """``launcher.app_launcher: name`` in the site's settings, for the pilots to come."""
    launcher = LauncherSettings.model_validate(
        site.settings.launcher.model_dump() | {"app_launcher": name}
    )
    written = site.write_settings(launcher=launcher).launcher
    assert (written.mode, written.app_launcher) == ("mpi", name)


@pytest.mark.parametrize("app_launcher", ["mpich", "srun"])
def test_an_mpi_pilot_in_a_slurm_allocation_runs_mpi4py_jobs_on_one_node_and_across_two(
    site: SlurmSite, app_launcher: str
) -> None:
    use_app_launcher(site, app_launcher)
    one, two = f"{app_launcher}/one", f"{app_launcher}/two"
    submitted = site.client.submit_jobs([
        {"site": SITE, "app": "mpi_where", "workdir": one, "ranks_per_node": 2},
        {"site": SITE, "app": "mpi_where", "workdir": two, "num_nodes": 2, "ranks_per_node": 1},
    ])  # fmt: skip
    jobs = [j["id"] for j in submitted["jobs"]]
    batch = site.submit_pilot("--num-nodes", "3", "--wall-time-min", "5", "--mode", "mpi")

    running = until("the pilot's batch job runs", lambda: batch_in(site, batch, "running"), site)
    until("the MPI jobs finished", lambda: jobs_in(site, jobs, "JOB_FINISHED"), site, 180)
    ended = until("the idle pilot ended its batch job",
                  lambda: batch_in(site, batch, "finished"), site)  # fmt: skip
    assert (ended["exit_code"], ended["scheduler_state"]) == (0, "finished")
    assert site.slurm.jobcomp()[running["scheduler_id"]]["JobState"] == "COMPLETED"
    with psycopg.connect(site.stack.database_url) as conn:
        [(mode, nodes)] = conn.execute(
            "SELECT mode, nodes FROM rm.sessions WHERE batch_job_id = %s", (batch,)
        ).fetchall()
    assert mode == "mpi"
    assert sorted(n["hostname"] for n in nodes) == list(NODES)
    this_host = socket.gethostname()

    # Two ranks on one node: one world of two, on the node the pilot placed the job on.
    [[node]] = placements(site, jobs[0])
    ranks = ranks_written(site, one)
    assert [(r["rank"], r["size"]) for r in ranks] == [(0, 2), (1, 2)], site.pilot_output()
    assert {(r["node"], r["host"], r["starter"]) for r in ranks} == {
        (node, this_host, STARTER[app_launcher])
    }

    # One rank on each of two nodes: the placement names two different nodes, and the ranks
    # ran one on each of them.
    [placed] = placements(site, jobs[1])
    assert len(set(placed)) == 2
    assert set(placed) <= set(NODES)
    ranks = ranks_written(site, two)
    assert [(r["rank"], r["size"]) for r in ranks] == [(0, 2), (1, 2)], site.pilot_output()
    assert sorted(r["node"] for r in ranks) == sorted(placed)
    assert {r["starter"] for r in ranks} == {STARTER[app_launcher]}
    # What the ranks printed is the job's output (Hydra may interleave the ranks' writes).
    out = (site.site_dir / "data" / two / "job.out").read_text()
    printed = "".join(f"{r['rank']} 2 {this_host} {r['node']} {r['starter']}\n" for r in ranks)
    assert sorted(out) == sorted(printed)


@pytest.mark.parametrize("app_launcher", ["mpich", "srun"])
def test_mpi_jobs_sharing_a_node_of_a_slurm_allocation_run_at_once(
    site: SlurmSite, app_launcher: str
) -> None:
    """Two 2-rank jobs packed on one 4-core node: each a job step of the allocation, neither
    waiting for the other's CPUs (each rank of either job waits until the other job runs)."""
    use_app_launcher(site, app_launcher)
    pair = {"ranks_per_node": 2, "node_packing_count": 2}
    submitted = site.client.submit_jobs([
        {"site": SITE, "app": "meet", "workdir": f"{app_launcher}/meet/a",
         "parameters": {"me": "a", "other": "b"}, **pair},
        {"site": SITE, "app": "meet", "workdir": f"{app_launcher}/meet/b",
         "parameters": {"me": "b", "other": "a"}, **pair},
    ])  # fmt: skip
    jobs = [j["id"] for j in submitted["jobs"]]
    batch = site.submit_pilot("--num-nodes", "1", "--wall-time-min", "5", "--mode", "mpi")

    until("the jobs finished or failed",
          lambda: all(site.client.get_job(j)["state"] in {"JOB_FINISHED", "RUN_ERROR",
                                                          "RESTART_READY", "FAILED"}
                      for j in jobs), site, 180)  # fmt: skip
    until("the idle pilot ended its batch job",
          lambda: batch_in(site, batch, "finished"), site)  # fmt: skip
    for job in jobs:
        events = site.client.job_events(job)
        failed = [e["data"].get("stderr_tail") for e in events
                  if e["type"] in {"job.run_errored", "job.run_timed_out"}]  # fmt: skip
        assert failed == [], site.pilot_output()
        [started] = [e for e in events if e["type"] == "job.started"]  # ran once
        assert len(started["data"]["placement"]) == 1
    assert len({tuple(placements(site, job)[0]) for job in jobs}) == 1  # the same node
    assert jobs_in(site, jobs, "JOB_FINISHED")
