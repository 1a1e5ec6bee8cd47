"""The MPICH launcher with a real Hydra ``mpiexec`` on this host (pip's ``mpich``, or any MPICH
on PATH); skipped where there is none. Two ranks on localhost: they run, see the environment
the launcher sets, are bound where the placement says, and die with the task."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lodestream.platform_adapters.compute import NodePlacement
from lodestream.platform_adapters.compute.machine import CpuBind
from lodestream.platform_adapters.launchers import MpichLauncher, TaskSpec
from lodestream.platform_adapters.packing import Allocation

WAIT_S = 60.0


def _hydra_mpiexec() -> str | None:
    """An MPICH (Hydra) mpiexec on PATH or beside this interpreter, else None."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which("mpiexec", path=path)
    if found is None:
        return None
    try:
        version = subprocess.run(
            [found, "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return found if "HYDRA" in version else None


MPIEXEC = _hydra_mpiexec()
pytestmark = pytest.mark.skipif(
    MPIEXEC is None, reason="no MPICH (Hydra) mpiexec on PATH or in the venv (pip install mpich)"
)


def spec_for(tmp_path: Path, script: str, *, cpu_ids: tuple[int, ...] = (0,)) -> TaskSpec:
    assert MPIEXEC is not None
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    path = os.pathsep.join([str(Path(MPIEXEC).parent), os.environ.get("PATH", os.defpath)])
    return TaskSpec(
        job_id="mpi-1",
        script=script,
        workdir=workdir,
        env={"PATH": path, "HOME": os.environ.get("HOME", str(tmp_path))},
        allocation=Allocation("mpi-1", (NodePlacement("localhost", cpu_ids),)),
        stdout_path=workdir / "out",
        stderr_path=workdir / "err",
        ranks_per_node=2,
        threads_per_rank=3,
        threads_per_core=3,  # one core per rank, three threads on it
    )


def mpich(cpu_bind: CpuBind = "none") -> MpichLauncher:
    assert MPIEXEC is not None
    launcher = MpichLauncher(executable=MPIEXEC, cpu_bind=cpu_bind)
    launcher.check_available()
    return launcher


def test_two_ranks_run_with_the_launchers_environment(tmp_path: Path) -> None:
    script = (
        'echo "rank=$PMI_RANK size=$PMI_SIZE host=$(hostname) omp=$OMP_NUM_THREADS'
        ' job=$LODE_JOB_ID"'
    )
    spec = spec_for(tmp_path, script)
    task = mpich().start(spec)
    assert task.wait(WAIT_S) == 0, task.stderr_tail()
    lines = sorted(spec.stdout_path.read_text().splitlines())
    host = socket.gethostname()
    assert lines == [
        f"rank=0 size=2 host={host} omp=3 job=mpi-1",
        f"rank=1 size=2 host={host} omp=3 job=mpi-1",
    ]


def test_a_failing_rank_fails_the_task(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, 'if [ "$PMI_RANK" = 1 ]; then exit 3; fi')
    task = mpich().start(spec)
    assert task.wait(WAIT_S) != 0


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable CPUs")
def test_placement_binds_each_rank_to_its_cores(tmp_path: Path) -> None:
    cpus = tuple(sorted(os.sched_getaffinity(0))[:2])
    script = 'echo "$PMI_RANK $(grep Cpus_allowed_list /proc/self/status | cut -f2)"'
    spec = spec_for(tmp_path, script, cpu_ids=cpus)
    task = mpich("placement").start(spec)
    assert task.wait(WAIT_S) == 0, task.stderr_tail()
    seen = dict(line.split() for line in spec.stdout_path.read_text().splitlines())
    assert seen == {"0": str(cpus[0]), "1": str(cpus[1])}


def test_terminate_ends_every_rank(tmp_path: Path) -> None:
    script = 'echo $$ > "rank$PMI_RANK.pid"; exec sleep 60'
    spec = spec_for(tmp_path, script)
    task = mpich().start(spec)
    pid_files = [spec.workdir / "rank0.pid", spec.workdir / "rank1.pid"]
    deadline = time.monotonic() + WAIT_S
    while not all(p.exists() and p.read_text().strip() for p in pid_files):
        assert task.poll() is None, task.stderr_tail()
        assert time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.05)
    ranks = [int(p.read_text()) for p in pid_files]
    task.terminate(grace_s=5)
    # Hydra forwards SIGTERM to the ranks and exits with a status of its own (15), not by the
    # signal: an MPI task's status is its launcher's.
    assert task.wait(WAIT_S) != 0
    deadline = time.monotonic() + WAIT_S
    while (alive := [pid for pid in ranks if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive == []


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] not in {"Z", "X"}
