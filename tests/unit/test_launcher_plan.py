"""What ``lode launcher`` settles before it connects (``agents/launcher/plan.py``) and the
command line that starts an mpi4py pilot's ranks (``agents/launcher/workers.py``)."""

from __future__ import annotations

import importlib.util
import shlex
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from lodestream.agents.launcher.errors import PilotRefused
from lodestream.agents.launcher.plan import PilotPlan, plan_pilot, site_shape
from lodestream.agents.launcher.workers import worker_command
from lodestream.agents.site.settings import SiteSettings
from lodestream.platform_adapters.compute.base import NodePlacement, NodeSpec
from lodestream.platform_adapters.compute.machine import load_machine
from lodestream.platform_adapters.launchers import MpiLauncher, TaskSpec
from lodestream.platform_adapters.packing import Allocation


def settings(tmp_path: Path, **launcher: Any) -> SiteSettings:
    return SiteSettings.model_validate({
        "site": "alpha", "nats": {"url": "wss://127.0.0.1:1"}, "directory": tmp_path,
        "launcher": {"virtual_nodes": 2, "cores_per_node": 4, **launcher},
    })  # fmt: skip


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH is this (empty) directory only: put stand-ins for mpiexec or srun in it."""
    path = tmp_path / "bin"
    path.mkdir()
    monkeypatch.setenv("PATH", str(path))
    return path


def stand_in(bin_dir: Path, name: str) -> Path:
    exe = bin_dir / name
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    return exe


def test_by_default_a_pilot_is_serial_and_runs_its_jobs_here(tmp_path: Path) -> None:
    plan = plan_pilot(settings(tmp_path))
    assert plan.mode == "serial"
    assert plan.app_launcher.name == "local"
    assert len(plan.nodes) == 2
    assert not plan.mpi4py_workers
    assert plan.site_shape.same_nodes  # the local machine: every pilot of the site has these


def test_mpi_mode_without_an_mpi_launcher_is_refused_with_the_remedy(tmp_path: Path) -> None:
    why = r"mpi mode starts every job with an MPI app launcher, but this site's is 'local'.*set"
    with pytest.raises(PilotRefused, match=why):
        plan_pilot(settings(tmp_path), mode="mpi")
    with pytest.raises(PilotRefused, match="this site's is 'local'"):
        plan_pilot(settings(tmp_path, mode="mpi"))  # the site's own mode


def test_a_launcher_not_on_path_is_refused(tmp_path: Path, bin_dir: Path) -> None:
    with pytest.raises(PilotRefused, match="'mpich' needs 'mpiexec', which is not on PATH"):
        plan_pilot(settings(tmp_path, app_launcher="mpich"), mode="mpi")
    with pytest.raises(PilotRefused, match="'srun' needs 'srun', which is not on PATH"):
        plan_pilot(settings(tmp_path, app_launcher="srun"))  # serial mode needs it too


def test_mpi_mode_sends_every_job_through_mpiexec_onto_this_hosts_virtual_nodes(
    tmp_path: Path, bin_dir: Path
) -> None:
    stand_in(bin_dir, "mpiexec")
    plan = plan_pilot(settings(tmp_path, app_launcher="mpich", mode="mpi"))
    assert plan.mode == "mpi"
    launcher = plan.app_launcher
    assert isinstance(launcher, MpiLauncher)
    placements = tuple(NodePlacement(n.hostname, n.cpu_ids) for n in plan.nodes)
    task = TaskSpec(job_id="j", script="true", workdir=tmp_path, env={},
                    allocation=Allocation("j", placements), stdout_path=tmp_path / "o",
                    stderr_path=tmp_path / "e")  # fmt: skip
    command = launcher.render_command(task)
    assert command[:7] == ["mpiexec", "-n", "2", "-ppn", "1", "-hosts", "localhost,localhost"]
    overridden = plan_pilot(settings(tmp_path, app_launcher="mpich", mode="mpi"), mode="serial")
    assert overridden.mode == "serial"  # lode launcher --mode serial


def test_mpi4py_workers_need_an_mpi_launcher_and_mpi4py(
    tmp_path: Path, bin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(PilotRefused, match="serial_workers: mpi4py starts one worker rank"):
        plan_pilot(settings(tmp_path, serial_workers="mpi4py"))
    one_node = plan_pilot(settings(tmp_path, serial_workers="mpi4py", virtual_nodes=1))
    assert not one_node.mpi4py_workers  # one node: the single-process pilot, no MPI needed
    stand_in(bin_dir, "mpiexec")
    workers = settings(tmp_path, serial_workers="mpi4py", app_launcher="mpich")
    if importlib.util.find_spec("mpi4py") is not None:
        assert plan_pilot(workers).mpi4py_workers
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(PilotRefused, match="needs the mpi4py package"):
        plan_pilot(workers)


def test_a_machine_that_cannot_be_described_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PilotRefused, match="no-such-machine"):
        plan_pilot(settings(tmp_path, machine="no-such-machine"))
    with pytest.raises(PilotRefused, match="SLURM_JOB_NODELIST is not set"):
        plan_pilot(settings(tmp_path, machine="generic-slurm", virtual_nodes=1), environ={})


def test_jobs_inherit_the_environment_less_the_pilots_rank(tmp_path: Path) -> None:
    plan = plan_pilot(settings(tmp_path), environ={"PATH": "/bin", "PMI_RANK": "0"})
    assert plan.base_env == {"PATH": "/bin"}


def test_what_every_pilot_of_a_site_shares_follows_from_its_machine() -> None:
    nodes = (NodeSpec("n1", (0, 1)),)
    local = site_shape(load_machine("local"), nodes)
    assert (local.same_nodes, local.same_node_shape) == (True, True)
    polaris = site_shape(load_machine("polaris"), nodes)  # the description states the node
    assert (polaris.same_nodes, polaris.same_node_shape) == (False, True)
    generic = site_shape(load_machine("generic-slurm"), nodes)  # the allocation says
    assert (generic.same_nodes, generic.same_node_shape) == (False, False)


def workers_plan(tmp_path: Path, **launcher: Any) -> PilotPlan:
    return plan_pilot(settings(tmp_path, serial_workers="mpi4py", **launcher),
                      environ={"SLURM_JOB_NODELIST": "n[1-2]",
                               "SLURM_JOB_CPUS_PER_NODE": "8(x2)"})  # fmt: skip


def test_the_ranks_start_one_per_node_through_mpiexec_unbound_and_kept_going(
    tmp_path: Path, bin_dir: Path
) -> None:
    mpiexec = stand_in(bin_dir, "mpiexec")
    batch = uuid.UUID("01900000-0000-7000-8000-0000000000b1")
    argv = worker_command(workers_plan(tmp_path, app_launcher="mpich"), tmp_path / "site",
                          wall_time_min=30, log_name="mpi-pilot-x", python="/py",
                          batch_job_id=batch)  # fmt: skip
    rank = ["/py", "-m", "lodestream.agents.launcher.mpi_worker", "--site",
            str((tmp_path / "site").absolute()), "--wall-time-min", "30",
            "--log-name", "mpi-pilot-x", "--batch-job-id", str(batch)]  # fmt: skip
    assert argv[:-3] == [str(mpiexec), "-n", "2", "-ppn", "1", "-hosts", "localhost,localhost",
                         "-bind-to", "none", "-disable-auto-cleanup"]  # fmt: skip
    assert argv[-2] == "-c"
    assert shlex.split(argv[-1]) == rank


def test_the_ranks_get_the_pilots_tag_filter(tmp_path: Path, bin_dir: Path) -> None:
    stand_in(bin_dir, "mpiexec")
    argv = worker_command(workers_plan(tmp_path, app_launcher="mpich"), tmp_path / "site",
                          wall_time_min=30, log_name="x", python="/py",
                          filter_tags={"beam": "A", "run": "7 b"})  # fmt: skip
    rank = shlex.split(argv[-1])
    assert rank[rank.index("--log-name") + 2 :] == ["--tag", "beam:A", "--tag", "run:7 b"]


def test_under_slurm_each_rank_is_a_task_holding_its_whole_node(
    tmp_path: Path, bin_dir: Path
) -> None:
    srun = stand_in(bin_dir, "srun")
    plan = workers_plan(tmp_path, machine="generic-slurm", virtual_nodes=1, cores_per_node=None)
    argv = worker_command(plan, tmp_path, wall_time_min=5, log_name="x", python=sys.executable)
    assert argv[0] == str(srun)
    options = set(argv[1 : argv.index("-c") - 1])
    assert {"--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--cpus-per-task=8",
            "--nodelist=n1,n2", "--cpu-bind=none"} <= options  # fmt: skip


@pytest.mark.parametrize(
    ("machine", "setting", "expected"),
    [
        ("generic-slurm", None, "pmi2"),  # the machine's: MpiDefault=none must not win
        ("generic-slurm", "pmix", "pmix"),  # the site's over the machine's
        ("generic-slurm", "default", None),  # the cluster's MpiDefault, no --mpi
        ("perlmutter-cpu", None, "cray_shasta"),
    ],
)
def test_srun_gets_the_pmi_plugin_of_the_site_or_else_of_its_machine(
    tmp_path: Path,
    bin_dir: Path,
    machine: str,
    setting: str | None,
    expected: str | None,
) -> None:
    stand_in(bin_dir, "srun")
    plan = plan_pilot(
        settings(tmp_path, machine=machine, virtual_nodes=1, cores_per_node=None,
                 srun_mpi=setting),
        mode="mpi", environ={"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_CPUS_PER_NODE": "4(x2)"},
    )  # fmt: skip
    placements = tuple(NodePlacement(n.hostname, n.cpu_ids[:1]) for n in plan.nodes)
    spec = TaskSpec(
        job_id="j", script="true", workdir=tmp_path, env={},
        allocation=Allocation("j", placements), stdout_path=tmp_path / "o",
        stderr_path=tmp_path / "e",
    )  # fmt: skip
    assert isinstance(plan.app_launcher, MpiLauncher)
    argv = plan.app_launcher.render_command(spec)
    mpi = [word for word in argv if word.startswith("--mpi")]
    assert mpi == ([f"--mpi={expected}"] if expected else [])


def test_a_site_cannot_pass_a_plugin_name_that_reads_as_an_option(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="srun_mpi"):
        settings(tmp_path, srun_mpi="--export=ALL")
