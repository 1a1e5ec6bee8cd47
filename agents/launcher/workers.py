"""``lode launcher`` in serial mode with ``serial_workers: mpi4py``: start one rank per node.

The ranks are started by the site's MPI app launcher, on every node of the allocation, one
per node, each holding its whole node (its jobs run inside it), unbound:

    mpiexec -n 2 -ppn 1 -hosts a,b -bind-to none -disable-auto-cleanup
        bash -c 'python -m lodestream.agents.launcher.mpi_worker --site … --log-name …'

(``srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --cpus-per-task=<cores> …`` under Slurm).
Hydra's ``-disable-auto-cleanup`` keeps the pilot running when a worker fails, so that rank 0
reports that worker's jobs instead of dying with them. ``lode launcher`` waits for the
launcher, passes SIGINT and SIGTERM on to it (which hands them to the ranks: rank 0 drains,
the workers wait for it), prints rank 0's log as it grows (the ranks write nothing to the
launcher, see :mod:`~lodestream.agents.launcher.mpi_worker`), and exits with rank 0's status.
"""

from __future__ import annotations

import copy
import os
import shlex
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Final

from lodestream.agents.launcher.plan import PilotPlan
from lodestream.platform_adapters.compute.base import NodePlacement
from lodestream.platform_adapters.launchers.base import TaskSpec
from lodestream.platform_adapters.launchers.mpi import MpiLauncher
from lodestream.platform_adapters.packing import Allocation
from lodestream.schemas.tagfilter import tag_options

WORKER_MODULE: Final = "lodestream.agents.launcher.mpi_worker"
# Options of the launchers that keep the other ranks alive when one fails.
KEEP_GOING: Final[Mapping[str, Mapping[str, str]]] = {
    "mpich": {"-disable-auto-cleanup": ""},
}
FOLLOW_S = 0.5


def worker_command(
    plan: PilotPlan,
    site_dir: Path,
    *,
    wall_time_min: float,
    log_name: str,
    batch_job_id: uuid.UUID | None = None,
    filter_tags: Mapping[str, str] | None = None,
    python: str = sys.executable,
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """The command line that starts the pilot's ranks, one per node (see the module doc)."""
    if not isinstance(plan.app_launcher, MpiLauncher):
        raise TypeError("the ranks are started by an MPI launcher")  # plan_pilot checked it
    launcher = copy.copy(plan.app_launcher)
    launcher.cpu_bind = "none"  # a rank's jobs use its whole node; binding is theirs to do
    argv = [python, "-m", WORKER_MODULE, "--site", str(site_dir.absolute()),
            "--wall-time-min", f"{wall_time_min:g}", "--log-name", log_name]  # fmt: skip
    if batch_job_id is not None:
        argv += ["--batch-job-id", str(batch_job_id)]
    argv += tag_options(filter_tags or {})
    env = dict(os.environ if environ is None else environ)
    spec = TaskSpec(
        job_id="pilot", script=shlex.join(argv), argv=tuple(argv), workdir=Path.cwd(),
        env=env, stdout_path=Path(os.devnull), stderr_path=Path(os.devnull),
        allocation=Allocation("pilot", tuple(
            NodePlacement(n.hostname, n.cpu_ids, n.gpu_ids) for n in plan.nodes
        )),
        ranks_per_node=1, threads_per_rank=max(1, min(len(n.cpu_ids) for n in plan.nodes)),
        launch_params=KEEP_GOING.get(launcher.name, {}),
    )  # fmt: skip
    return launcher.argv_for(spec, env)


def run_workers(
    plan: PilotPlan,
    site_dir: Path,
    *,
    wall_time_min: float,
    batch_job_id: uuid.UUID | None,
    echo: Callable[[str], None],
    filter_tags: Mapping[str, str] | None = None,
) -> int:
    """Start the ranks, ``echo`` rank 0's log lines until they end; rank 0's exit status
    (the launcher's when rank 0 left none)."""
    name = f"mpi-pilot-{datetime.now(UTC):%Y%m%dT%H%M%S}-{os.getpid()}"
    logs = site_dir / "log"
    argv = worker_command(plan, site_dir, wall_time_min=wall_time_min, log_name=name,
                          batch_job_id=batch_job_id, filter_tags=filter_tags)  # fmt: skip
    echo(f"pilot ranks: {shlex.join(argv)}")
    echo(f"their logs: {logs}/{name}-rank*.log")
    proc = subprocess.Popen(argv, env=dict(os.environ))

    def forward(signum: int, _frame: FrameType | None) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    done = threading.Event()
    follower = threading.Thread(target=_follow, args=(logs / f"{name}-rank0.log", echo, done),
                                daemon=True)  # fmt: skip
    follower.start()
    try:
        status = proc.wait()
    finally:
        done.set()
        follower.join(5)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    try:
        return int((logs / f"{name}.exit").read_text())
    except (OSError, ValueError):
        return status if status >= 0 else 128 - status


def _follow(path: Path, echo: Callable[[str], None], done: threading.Event) -> None:
    """Echo the lines added to ``path`` (once it exists) until ``done``, then the rest."""
    offset = 0
    pending = ""
    while True:
        finished = done.is_set()
        try:
            with path.open(errors="replace") as f:
                f.seek(offset)
                chunk = f.read()
                offset = f.tell()
        except FileNotFoundError:
            chunk = ""
        pending += chunk
        *lines, pending = pending.split("\n")
        for line in lines:
            echo(line)
        if finished:
            if pending:
                echo(pending)
            return
        done.wait(FOLLOW_S)
