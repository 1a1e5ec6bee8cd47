"""Pilots with real MPI (pip's MPICH and mpi4py) against the real stack, on this host.

* mpi mode: every job through ``mpiexec`` onto the virtual nodes the packer gives it; a
  two-rank mpi4py job across two nodes runs and finishes; a serial job is a one-rank launch;
  a job needing more nodes than the site's pilots have fails with the reason;
* serial mode with mpi4py workers: rank 0 leases and reports, the worker ranks run the jobs
  of their nodes, each job once; ``lode launcher`` starts the ranks itself;
* a worker rank that hangs or dies: the job it ran is reported timed out, not lost.

Skipped where there is no Hydra ``mpiexec`` or no mpi4py.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

import lodestream
from lodestream.agents.launcher.main import run as run_launcher
from lodestream.agents.site.settings import SiteSettings
from lodestream.eventlog import EventLog
from lodestream.schemas.events.job import RunProfile
from tests.fixtures.nats import SecureNats
from tests.integration.test_launcher import (
    OWNER,
    SITE,
    control_plane,
    started_counts,
    submit,
    until_all,
)
from tests.integration.test_platform_mpi import MPIEXEC
from tests.support.builders import job_created, site_registered
from tests.support.site import secure_site_dir

pytestmark = pytest.mark.skipif(
    MPIEXEC is None or importlib.util.find_spec("mpi4py") is None,
    reason="needs MPICH's mpiexec and mpi4py (pip install mpich mpi4py)",
)

WAIT_S = 90.0
REPO = Path(lodestream.__file__).resolve().parent.parent
APPS = """
from lodestream.agents.site.apps import ApplicationDefinition


class MpiHello(ApplicationDefinition):
    \"\"\"Each rank writes its rank and the size of its world to a file of its own.\"\"\"

    name = "mpi_hello"
    command_template = (
        "PYTHON -c 'from mpi4py import MPI; c = MPI.COMM_WORLD; "
        "open(\\"rank%d.txt\\" % c.rank, \\"w\\").write(\\"%d %d\\" % (c.rank, c.size))'"
    )


class Where(ApplicationDefinition):
    \"\"\"Says which rank of the pilot ran it, on which of its nodes, under which process.\"\"\"

    name = "where"
    command_template = (
        'echo "rank=$LODE_WORKER_RANK node=$LODE_NODE_HOSTNAMES ppid=$PPID" > where.txt'
    )


class Hang(ApplicationDefinition):
    name = "hang"
    command_template = (
        'echo "rank=$LODE_WORKER_RANK node=$LODE_NODE_HOSTNAMES ppid=$PPID" > where.txt; '
        "sleep 120"
    )
""".replace("PYTHON", sys.executable)


@pytest.fixture(autouse=True)
def mpi_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """pip's ``mpiexec`` sits beside this interpreter; pilots look for it on PATH."""
    assert MPIEXEC is not None
    monkeypatch.setenv("PATH", f"{Path(MPIEXEC).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(REPO))


def mpi_site(secure_nats: SecureNats, root: Path, **launcher: Any) -> SiteSettings:
    settings = secure_site_dir(secure_nats, root, app_launcher="mpich", **launcher)
    (settings.apps_dir / "mpi.py").write_text(APPS)
    return settings


def spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip


@contextlib.contextmanager
def ranks(site: SiteSettings, n: int) -> Iterator[subprocess.Popen[bytes]]:
    """``n`` ranks of an mpi4py serial pilot under pip's mpiexec, as a batch script starts them."""
    assert MPIEXEC is not None
    argv = [MPIEXEC, "-n", str(n), "-disable-auto-cleanup", sys.executable, "-m",
            "lodestream.agents.launcher.mpi_worker", "--site", str(site.directory),
            "--wall-time-min", "10"]  # fmt: skip
    proc = spawn(argv, site.log_dir / "ranks.log")
    try:
        yield proc
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


async def events(dsn: str, job_id: uuid.UUID) -> list[tuple[str, dict[str, Any]]]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT type, data FROM rm.job_events WHERE job_id = %s ORDER BY seq", (job_id,)
        )
        return [(str(t), dict(d)) for t, d in await cursor.fetchall()]


async def session_modes(dsn: str) -> list[str]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute("SELECT mode FROM rm.sessions WHERE site = %s", (SITE,))
        return [str(r[0]) for r in await cursor.fetchall()]


def where(settings: SiteSettings, workdir: str) -> dict[str, str]:
    """What a ``where`` or ``hang`` job wrote: its rank, node and parent process."""
    text = (settings.data_dir / workdir / "where.txt").read_text()
    if not text.endswith("\n"):
        raise FileNotFoundError(workdir)  # not written yet
    return dict(word.split("=", 1) for word in text.split())


async def test_mpi_mode_runs_an_mpi4py_job_across_two_nodes_and_refuses_one_too_big(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    settings = mpi_site(secure_nats, tmp_path, mode="mpi", virtual_nodes=2, cores_per_node=2)
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        mpi = job_created(SITE, OWNER, app="mpi_hello", workdir="mpi", num_nodes=2)
        serial = job_created(SITE, OWNER, app="where", workdir="serial")
        big = job_created(SITE, OWNER, app="mpi_hello", workdir="big", num_nodes=3)
        ids = await submit(js, [mpi, serial, big])
        stop_pilot = asyncio.Event()
        pilot = asyncio.create_task(
            run_launcher(settings.directory, wall_time_min=10, stop=stop_pilot)
        )
        await until_all(database_url, ids[:2], "JOB_FINISHED", WAIT_S)
        await until_all(database_url, ids[2:], "RUN_ERROR", WAIT_S)
        stop_pilot.set()
        report = await asyncio.wait_for(pilot, 60)
        refused = await events(database_url, ids[2])
        modes = await session_modes(database_url)
    assert (report.finished, report.errored, report.refused) == (2, 1, 1)
    assert modes == ["mpi"]
    written = sorted(p.read_text() for p in (settings.data_dir / "mpi").glob("rank*.txt"))
    assert written == ["0 2", "1 2"]
    # A serial job in mpi mode is a one-rank launch on one node; no worker rank is involved.
    ran = where(settings, "serial")
    assert ran["rank"] == ""
    assert ran["node"] in {n.hostname for n in settings_nodes(settings)}
    # The job too big for every pilot of the site: leased with no placement, never run,
    # and failed with the reason on its own history.
    assert [t for t, _ in refused] == ["job.created", "job.preprocessed", "job.started",
                                       "job.run_errored"]  # fmt: skip
    started, errored = refused[2][1], refused[3][1]
    assert started["placement"] == []
    assert errored["cause"] == ["cannot run at this site"]
    assert "needs 3 nodes; this pilot has 2" in errored["stderr_tail"]
    assert "no pilot of this site can run it" in errored["stderr_tail"]
    assert not (settings.data_dir / "big").exists()


def rank_logs(settings: SiteSettings) -> str:
    """What the ranks logged (they write nothing to mpiexec)."""
    return "".join(p.read_text() for p in sorted(settings.log_dir.glob("mpi-pilot-*.log")))


def settings_nodes(settings: SiteSettings) -> list[Any]:
    from lodestream.platform_adapters.compute.local import local_nodes  # noqa: PLC0415

    cfg = settings.launcher
    return local_nodes(cfg.virtual_nodes, cfg.cores_per_node)


async def test_mpi4py_workers_run_serial_jobs_once_each_across_their_ranks(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    settings = mpi_site(secure_nats, tmp_path, serial_workers="mpi4py", virtual_nodes=2,
                        cores_per_node=2, idle_ttl_s=2)  # fmt: skip
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        jobs = [job_created(SITE, OWNER, app="where", workdir=f"w/{i}") for i in range(24)]
        failing = job_created(SITE, OWNER, app="fails", workdir="f", parameters={"why": "boom"})
        ids = await submit(js, [*jobs, failing])
        with ranks(settings, 3) as proc:  # rank 0 leases; ranks 1 and 2 serve a node each
            await until_all(database_url, ids[:-1], "JOB_FINISHED", WAIT_S)
            await until_all(database_url, ids[-1:], "RUN_ERROR", WAIT_S)
            code = await asyncio.to_thread(proc.wait, WAIT_S)  # idle: the pilot exits
        counts = await started_counts(database_url, ids)
        errored = await events(database_url, ids[-1])
        modes = await session_modes(database_url)
    log = rank_logs(settings)
    assert code == 0, log
    assert set(counts.values()) == {1}, counts
    assert len(counts) == len(ids)
    seen = {(w["rank"], w["node"]) for i in range(24) if (w := where(settings, f"w/{i}"))}
    nodes = [n.hostname for n in settings_nodes(settings)]
    assert {rank for rank, _ in seen} == {"1", "2"}, log  # rank 0 only leased
    assert {node for _, node in seen} == set(nodes)
    assert len({(r, n) for r, n in seen}) == 2  # one rank per node, the same all along
    # A worker's failing job: its stderr tail comes back from the worker's node.
    assert errored[-1][0] == "job.run_errored"
    assert "boom" in errored[-1][1]["stderr_tail"]
    # Its profile: rank 0's times, and the pid the worker's node gave the task.
    profile = RunProfile.model_validate(errored[-1][1]["profile"])
    assert profile.pid is not None
    assert profile.exited_at is not None
    assert modes == ["serial"]


async def test_lode_launcher_starts_one_rank_per_node(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    settings = mpi_site(secure_nats, tmp_path, serial_workers="mpi4py", virtual_nodes=2,
                        cores_per_node=1, idle_ttl_s=2)  # fmt: skip
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        ids = await submit(
            js, [job_created(SITE, OWNER, app="where", workdir=f"w/{i}") for i in range(8)]
        )
        cli = [sys.executable, "-m", "lodestream.client.cli.main", "launcher",
               "--site", str(settings.directory), "--wall-time-min", "10"]  # fmt: skip
        proc = spawn(cli, tmp_path / "lode.log")
        try:
            await until_all(database_url, ids, "JOB_FINISHED", WAIT_S)
            code = await asyncio.to_thread(proc.wait, WAIT_S)
        finally:
            stop(proc)
    log = (tmp_path / "lode.log").read_text()
    assert code == 0, log
    assert "launcher done (idle): 8 finished" in log  # rank 0's log, followed by lode
    # Two nodes, two ranks: rank 0 serves one node besides leasing, rank 1 the other.
    assert {where(settings, f"w/{i}")["rank"] for i in range(8)} == {"0", "1"}, log


@dataclass
class Outage:
    """What became of two ``hang`` jobs, one per worker rank, after one worker was hit."""

    victim: list[tuple[str, dict[str, Any]]]  # the hit worker's job's events
    survivor: str  # the type of the other job's last event
    pilot_alive: bool
    victim_tasks_left: list[int]  # processes of the hit worker's job still running after
    log: str


async def hit_a_worker(
    secure_nats: SecureNats, database_url: str, root: Path, signum: signal.Signals
) -> Outage:
    """Two ``hang`` jobs on two worker ranks; ``signum`` to rank 2 once both run."""
    settings = mpi_site(secure_nats, root, serial_workers="mpi4py", virtual_nodes=2,
                        cores_per_node=1, worker_timeout_s=2)  # fmt: skip
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        jobs = [job_created(SITE, OWNER, app="hang", workdir=f"h/{i}") for i in range(2)]
        ids = await submit(js, jobs)
        tasks: dict[int, list[int]] = {}
        try:
            with ranks(settings, 3) as proc:
                await until_all(database_url, ids, "RUNNING", WAIT_S)
                placed = await until_written(settings, ["h/0", "h/1"])
                victim = next(i for i, w in enumerate(placed) if w["rank"] == "2")
                tasks = {i: children(int(w["ppid"])) for i, w in enumerate(placed)}
                worker = int(placed[victim]["ppid"])
                os.kill(worker, signum)
                await until_all(database_url, ids[victim : victim + 1], "RUN_TIMEOUT", WAIT_S)
                alive = proc.poll() is None
                if signum == signal.SIGSTOP:  # it wakes up to a rank 0 that gave up on it
                    os.kill(worker, signal.SIGCONT)
                    await until_gone(tasks[victim])
                outage = Outage(
                    victim=await events(database_url, ids[victim]),
                    survivor=(await events(database_url, ids[1 - victim]))[-1][0],
                    pilot_alive=alive, victim_tasks_left=alive_of(tasks[victim]),
                    log=rank_logs(settings),
                )  # fmt: skip
        finally:
            for pid in (pid for pids in tasks.values() for pid in pids):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)  # what the batch job's end would do
    return outage


async def test_a_hung_worker_rank_is_lost_and_its_job_reported_timed_out(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    outage = await hit_a_worker(secure_nats, database_url, tmp_path, signal.SIGSTOP)
    kind, data = outage.victim[-1]
    assert kind == "job.run_timed_out", outage.log
    assert data["cause"][0].startswith("worker rank 2 (node "), outage.log
    assert "lost: silent for 2 s" in data["cause"][0]
    # The rest of the pilot goes on: its other job still runs.
    assert outage.pilot_alive
    assert outage.survivor == "job.started"
    # Woken up, the worker finds rank 0 silent: it kills its job (nobody could report it).
    assert outage.victim_tasks_left == []
    assert "rank 0 silent for 2 s" in outage.log


async def test_a_killed_worker_rank_has_its_job_reported_timed_out(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    """Not lost, whichever way: rank 0 reports it, or, when MPICH's mpiexec takes every rank
    down with the dead one (it does now and then, ``-disable-auto-cleanup`` notwithstanding),
    the controller times out the session's jobs once its heartbeat expires."""
    outage = await hit_a_worker(secure_nats, database_url, tmp_path, signal.SIGKILL)
    kind, data = outage.victim[-1]
    assert kind == "job.run_timed_out", outage.log
    cause = data["cause"][0]
    if outage.pilot_alive:
        assert cause.startswith("worker rank 2 (node "), outage.log
        assert outage.survivor == "job.started"
    else:
        assert "heartbeat expired" in cause, outage.log


async def until_written(settings: SiteSettings, workdirs: list[str]) -> list[dict[str, str]]:
    async with asyncio.timeout(WAIT_S):
        while True:
            with contextlib.suppress(FileNotFoundError):
                return [where(settings, w) for w in workdirs]
            await asyncio.sleep(0.05)


async def until_gone(pids: list[int]) -> None:
    async with asyncio.timeout(WAIT_S):
        while alive_of(pids):
            await asyncio.sleep(0.05)


def alive_of(pids: list[int]) -> list[int]:
    return [pid for pid in pids if _running(pid)]


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] not in {"Z", "X"}


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a worker's tasks)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                if int(stat.rpartition(")")[2].split()[1]) == pid:
                    found.append(int(entry.name))
    return found
