"""The real Slurm test cluster does what the scheduler and MPI paths will rely on.

Each test submits real batch jobs to tests/fixtures/slurm.py's cluster (three slurmd on
loopback, partition ``debug``) and checks them through Slurm's own tools: ``scontrol``,
``squeue --json`` and the ``jobcomp/filetxt`` record of finished jobs. The MPI tests run a
2-rank mpi4py program with pip MPICH's ``mpiexec`` and with ``srun --mpi=pmi2``.
"""

from __future__ import annotations

import os
import shlex
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.fixtures.slurm import SlurmCluster

RELEASE_WAIT_S = 60
# Rank 0 prints for everyone: two ranks printing at once can interleave within a line once
# mpiexec's proxies forward their output.
RANKS_PROGRAM = textwrap.dedent(
    """\
    import os
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    total = comm.allreduce(comm.Get_rank())
    node = os.environ.get("SLURMD_NODENAME", "?")
    seen = comm.gather(f"rank={comm.Get_rank()} size={comm.Get_size()} sum={total} node={node}")
    if seen is not None:
        print("\\n".join(seen), flush=True)
    """
)


def held_script(release: Path, *body: str) -> str:
    """A batch script that runs ``body`` and then waits for ``release`` to appear."""
    return "\n".join(
        [
            "#!/bin/bash",
            "set -eu",
            *body,
            f"for _ in $(seq {RELEASE_WAIT_S * 10}); do",
            f"  [ -e {shlex.quote(str(release))} ] && exit 0",
            "  sleep 0.1",
            "done",
            "exit 99",
            "",
        ]
    )


def test_a_batch_job_runs_shows_in_squeue_and_completes(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    out, release = tmp_path / "job.out", tmp_path / "release"
    job = slurm.sbatch(
        held_script(release, 'echo "hello from $SLURMD_NODENAME"'),
        job_name="held",
        output=str(out),
    )

    assert slurm.wait_state(job, {"RUNNING"}) == "RUNNING"
    listed = {entry["job_id"]: entry for entry in slurm.squeue_json()["jobs"]}
    assert listed[job]["job_state"] == "RUNNING"
    assert listed[job]["name"] == "held"
    assert listed[job]["partition"] == "debug"
    node = listed[job]["nodes"]
    assert node in slurm.nodes

    release.touch()
    slurm.wait_state(job, {"COMPLETED"})
    assert out.read_text() == f"hello from {node}\n"
    record = slurm.jobcomp()[str(job)]
    assert record["JobState"] == "COMPLETED"
    assert record["ExitCode"] == "0:0"
    assert record["NodeList"] == node


def test_a_failing_job_is_recorded_with_its_exit_code(slurm: SlurmCluster, tmp_path: Path) -> None:
    job = slurm.sbatch("#!/bin/bash\nexit 3\n", output=str(tmp_path / "job.out"))

    assert slurm.wait_state(job, {"FAILED"}) == "FAILED"
    record = slurm.jobcomp()[str(job)]
    assert record["JobState"] == "FAILED"
    assert record["ExitCode"] == "3:0"


def test_scancel_stops_a_running_job_and_its_processes(slurm: SlurmCluster, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    job = slurm.sbatch(
        f"#!/bin/bash\necho $$ > {shlex.quote(str(pid_file))}\nexec sleep 600\n",
        output=str(tmp_path / "job.out"),
    )
    slurm.wait_state(job, {"RUNNING"})
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline, "the job never wrote its pid"
        time.sleep(0.1)
    pid = int(pid_file.read_text())

    slurm.run("scancel", str(job))

    assert slurm.wait_state(job, {"CANCELLED"}) == "CANCELLED"
    deadline = time.monotonic() + 15
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, f"the job's process {pid} outlived scancel"
        time.sleep(0.1)
    assert slurm.jobcomp()[str(job)]["JobState"] == "CANCELLED"


def test_an_allocation_spans_all_three_nodes(slurm: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "job.out"
    job = slurm.sbatch(
        "#!/bin/bash\n"
        'echo "$SLURM_JOB_NODELIST $SLURM_JOB_NUM_NODES"\n'
        "srun --ntasks-per-node=1 bash -c 'echo $SLURMD_NODENAME' | sort\n",
        nodes=3,
        output=str(out),
    )

    slurm.wait_state(job, {"COMPLETED"})
    assert out.read_text().splitlines() == ["n[1-3] 3", "n1", "n2", "n3"]
    record = slurm.jobcomp()[str(job)]
    assert (record["NodeList"], record["NodeCnt"]) == ("n[1-3]", "3")


@pytest.fixture
def ranks_program(tmp_path: Path) -> Path:
    pytest.importorskip("mpi4py", reason="the mpi extra is not installed: pip install -e '.[mpi]'")
    program = tmp_path / "ranks.py"
    program.write_text(RANKS_PROGRAM)
    return program


def venv_mpiexec() -> str:
    """pip MPICH's ``mpiexec``, beside this interpreter (the venv need not be on PATH)."""
    mpiexec = Path(sys.executable).parent / "mpiexec"
    if not os.access(mpiexec, os.X_OK):
        pytest.skip(f"no {mpiexec}: the mpi extra is not installed: pip install -e '.[mpi]'")
    return str(mpiexec)


@pytest.mark.parametrize(
    ("launch", "options", "nodes"),
    [
        pytest.param("{mpiexec} -n 2", {"ntasks": 2}, {"n1"}, id="mpiexec-one-node"),
        pytest.param("srun --mpi=pmi2 -n 2", {"ntasks": 2}, {"n1"}, id="srun-pmi2-one-node"),
        pytest.param(
            "srun -N 2 --ntasks-per-node=1 --mpi=pmi2",
            {"nodes": 2, "ntasks_per_node": 1},
            {"n1", "n2"},
            id="srun-pmi2-two-nodes",
        ),
        pytest.param(
            "{mpiexec} -n 2 -ppn 1",
            {"nodes": 2, "ntasks_per_node": 1},
            {"n1", "n2"},
            id="mpiexec-two-nodes",
        ),
    ],
)
def test_a_two_rank_mpi4py_program_runs_inside_an_allocation(
    slurm: SlurmCluster,
    tmp_path: Path,
    ranks_program: Path,
    launch: str,
    options: dict[str, int],
    nodes: set[str],
) -> None:
    out = tmp_path / "job.out"
    command = launch.format(mpiexec=venv_mpiexec())
    job = slurm.sbatch(
        f"#!/bin/bash\nset -eu\n{command} {shlex.quote(sys.executable)} {ranks_program}\n",
        output=str(out),
        **options,
    )

    state = slurm.wait_state(job, {"COMPLETED", "FAILED"}, timeout=60)
    lines = sorted(line for line in out.read_text().splitlines() if line.startswith("rank="))
    assert state == "COMPLETED", out.read_text()
    assert [line.rsplit(" node=", 1)[0] for line in lines] == [
        "rank=0 size=2 sum=1",
        "rank=1 size=2 sum=1",
    ]
    assert {line.rsplit("node=", 1)[1] for line in lines} == nodes
