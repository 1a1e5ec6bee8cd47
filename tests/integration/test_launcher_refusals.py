"""``lode launcher`` refuses, before it connects, what this machine cannot do: the reason on
stderr and exit status 2. The site's NATS URL leads nowhere: a pilot that tried to connect
would wait there instead of exiting."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import lodestream

REPO = Path(lodestream.__file__).resolve().parent.parent


def lode_launcher(site: Path, *args: str, path: str) -> subprocess.CompletedProcess[str]:
    outside = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env = {**outside, "PATH": path, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "lodestream.client.cli.main", "launcher", "--site", str(site),
         "--wall-time-min", "10", *args],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("launcher", "args", "message"),
    [
        ("{}", ["--mode", "mpi"],
         "mpi mode starts every job with an MPI app launcher, but this site's is 'local'"),
        ("{mode: mpi}", [],
         "mpi mode starts every job with an MPI app launcher, but this site's is 'local'"),
        ("{mode: mpi, app_launcher: mpich}", [],
         "app launcher 'mpich' needs 'mpiexec', which is not on PATH"),
        ("{app_launcher: srun}", ["--mode", "serial"],
         "app launcher 'srun' needs 'srun', which is not on PATH"),
        ("{serial_workers: mpi4py, virtual_nodes: 2}", [],
         "serial_workers: mpi4py starts one worker rank per node with an MPI app launcher"),
        ("{serial_workers: mpi4py, virtual_nodes: 2, app_launcher: mpich}", [],
         "app launcher 'mpich' needs 'mpiexec', which is not on PATH"),
        ("{machine: frontier}", [], "SLURM_JOB_NODELIST is not set: not inside a Slurm job"),
    ],
)  # fmt: skip
def test_a_setting_this_machine_cannot_honour_is_refused_before_connecting(
    tmp_path: Path, launcher: str, args: list[str], message: str
) -> None:
    (tmp_path / "apps").mkdir()
    (tmp_path / "settings.yml").write_text(
        f"site: alpha\nnats: {{url: 'wss://127.0.0.1:1'}}\nlauncher: {launcher}\n"
    )
    result = lode_launcher(tmp_path, *args, path=str(tmp_path / "empty-bin"))
    output = result.stderr + result.stdout
    assert result.returncode == 2, output
    assert message in " ".join(output.split()), output  # rich may wrap the line
    assert "error:" in output
    assert "NATS" not in output  # refused before any attempt to connect


def test_an_unknown_mode_is_refused(tmp_path: Path) -> None:
    (tmp_path / "apps").mkdir()
    (tmp_path / "settings.yml").write_text("site: alpha\nnats: {url: 'wss://127.0.0.1:1'}\n")
    result = lode_launcher(tmp_path, "--mode", "hybrid", path=os.environ["PATH"])
    assert result.returncode == 2
    assert "mode must be serial or mpi" in result.stderr + result.stdout


@pytest.mark.parametrize(
    ("tags", "message"),
    [
        (["beam"], "--tag must look like key:value, got 'beam'"),
        (["beam=A"], "write --tag beam:A"),
        (["be am:A"], "a tag key is 1 to 64 letters, digits or _.:-"),
        (["beam:A", "beam:B"], "--tag beam is given twice"),
    ],
)
def test_a_tag_filter_no_job_could_match_is_refused_before_connecting(
    tmp_path: Path, tags: list[str], message: str
) -> None:
    (tmp_path / "apps").mkdir()
    (tmp_path / "settings.yml").write_text("site: alpha\nnats: {url: 'wss://127.0.0.1:1'}\n")
    args = [word for tag in tags for word in ("--tag", tag)]
    result = lode_launcher(tmp_path, *args, path=os.environ["PATH"])
    output = result.stderr + result.stdout
    assert result.returncode == 2, output
    assert message in " ".join(output.replace("│", " ").split()), output  # rich draws a box
    assert "NATS" not in output
