"""Issue 11: no-op jobs/s of the mpi4py serial mode with 1, 2 and 4 worker ranks.

    python -m bench.mpi_serial [--jobs 4000] [--workers 1,2,4] [--out bench/out]

Starts an embedded stack (api, projector, controller) and a local site with its agent, then
runs the same workload against each pilot in turn:

* ``single``: the single-process serial pilot (``lode launcher``), one node of 64 slots, for
  comparison;
* ``W workers``: ``mpiexec -n W+1 python -m lodestream.agents.launcher.mpi_worker`` under pip's
  MPICH: rank 0 leases and reports (it serves no node), ranks 1..W each run the jobs of one
  virtual node of 64 slots (``virtual_nodes: W``, ``cores_per_node: 64``).

Each run submits ``--jobs`` ``/bin/true`` jobs (``node_packing_count`` 64) once the pilot's
session is open, and measures from the first submission to the last JOB_FINISHED visible in
the read model, with the CPU of every component (each rank's includes its jobs'). Every
process shares this machine's cores: on a 2-core machine more ranks are more processes
competing for the same two cores, not more hardware.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from bench.lifecycle import LifecycleBench
from bench.probe import _children, _stat_fields
from lodestream.services.embedded.process import ServiceProcess

SLOTS_PER_NODE = 64
WORKER_MODULE = "lodestream.agents.launcher.mpi_worker"


class MpiSerialBench(LifecycleBench):
    def configure(self, **launcher: Any) -> None:
        """Rewrite the site's launcher settings (the agent read its own at start)."""
        path = self.site_dir / "settings.yml"
        settings = yaml.safe_load(path.read_text())
        settings["launcher"] = {**settings.get("launcher", {}), **launcher}
        path.write_text(yaml.safe_dump(settings, sort_keys=False))

    def start_ranks(self, workers: int) -> ServiceProcess:
        """W worker ranks and rank 0, under pip's mpiexec, as a batch script starts them."""
        mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent))
        if mpiexec is None:
            raise SystemExit("no mpiexec beside this interpreter: pip install mpich mpi4py")
        self.configure(virtual_nodes=workers, cores_per_node=SLOTS_PER_NODE,
                       app_launcher="mpich", serial_workers="mpi4py")  # fmt: skip
        argv = [mpiexec, "-n", str(workers + 1), "-disable-auto-cleanup", sys.executable, "-m",
                WORKER_MODULE, "--site", str(self.site_dir), "--wall-time-min", "600"]  # fmt: skip
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        ranks = ServiceProcess(f"ranks-{workers}", argv, {"PATH": path},
                               self.root / f"ranks-{workers}.log")  # fmt: skip
        return self._started(ranks)

    def start_single(self) -> ServiceProcess:
        self.configure(virtual_nodes=1, cores_per_node=SLOTS_PER_NODE, app_launcher=None,
                       serial_workers="none")  # fmt: skip
        cli = [sys.executable, "-m", "lodestream.client.cli.main", "launcher",
               "--site", str(self.site_dir), "--wall-time-min", "600"]  # fmt: skip
        return self._started(ServiceProcess("single", cli, {}, self.root / "single.log"))

    def _started(self, pilot: ServiceProcess) -> ServiceProcess:
        opened = self._open_sessions()
        pilot.start()
        self.pilots.append(pilot)
        deadline = time.monotonic() + 120
        while self._open_sessions() <= opened:
            if time.monotonic() > deadline or not pilot.running:
                raise RuntimeError(f"pilot {pilot.name} did not open its session; see its log")
            time.sleep(0.05)
        return pilot

    def stop_pilot(self, pilot: ServiceProcess) -> None:
        pilot.stop(timeout_s=60)
        self.pilots.remove(pilot)

    def pids(self) -> dict[str, int]:
        """The stack's, and each rank of a running mpi4py pilot as its own component."""
        pids = super().pids()
        for pilot in self.pilots:
            if pilot.pid is not None and pilot.name.startswith("ranks-"):
                for rank, pid in _ranks_below(pilot.pid).items():
                    pids[f"{pilot.name} rank {rank}"] = pid
        return pids


def _ranks_below(pid: int) -> dict[int, int]:
    """The MPI ranks among the processes below ``pid`` (mpiexec), by rank (``PMI_RANK``)."""
    ranks: dict[int, int] = {}
    todo = [pid]
    while todo:
        for child in _children(todo.pop()):
            todo.append(child)
            try:
                environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            rank = next((v[9:] for v in environ if v.startswith(b"PMI_RANK=")), None)
            if rank is not None and _stat_fields(child):
                ranks.setdefault(int(rank), child)  # the rank, not a job it started
    return ranks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--workers", default="1,2,4", help="worker rank counts to measure")
    parser.add_argument("--single", action=argparse.BooleanOptionalAction, default=True,
                        help="measure the single-process serial pilot first")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="lode-mpi-serial-"))
    root.chmod(0o711)  # Postgres runs as its own account when we are root
    bench = MpiSerialBench(root)
    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(), "cpus": os.cpu_count(), "jobs": args.jobs,
        "slots_per_node": SLOTS_PER_NODE, "runs": {},
    }  # fmt: skip
    runs: list[tuple[str, Any]] = [("single", bench.start_single)] if args.single else []
    for workers in (int(w) for w in args.workers.split(",")):
        runs.append((f"{workers} workers", lambda w=workers: bench.start_ranks(w)))
    try:
        bench.start()
        for name, start in runs:
            pilot = start()
            measured = bench.throughput(args.jobs)
            measured.pop("progress", None)
            results["runs"][name] = measured
            print(json.dumps({name: {k: measured[k] for k in ("jobs_per_s", "seconds",
                                                                "finished", "cpu_percent")}},
                             indent=2), flush=True)  # fmt: skip
            bench.stop_pilot(pilot)
    finally:
        bench.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"mpi-serial-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
