"""Pilots as real processes, killed and paused: nothing lost, nothing run twice, zombies fenced."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest

from lodestream.agents.site.settings import SiteSettings
from lodestream.eventlog import EventLog
from lodestream.schemas.events import JobKilled
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.schemas.topology import LAUNCH
from tests.fixtures.nats import SecureNats
from tests.integration.test_launcher import (
    control_plane,
    started_counts,
    submit,
    until_all,
)
from tests.support.builders import job_created, site_registered
from tests.support.projection import wait_for_position
from tests.support.site import secure_site_dir

pytestmark = pytest.mark.slow
SITE, OWNER = "alpha", "ada"


def spawn(what: str, settings: SiteSettings, log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "lodestream.client.cli.main"]
    if what == "launcher":
        argv += ["launcher", "--site", str(settings.directory), "--wall-time-min", "10"]
    else:
        argv += ["site", "start", str(settings.directory)]
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


def processes_running(cmdline: bytes, under: Path) -> list[str]:
    """Pids whose whole command line is ``cmdline`` (arguments separated by NUL; the program
    by its name, as the pilot may exec it by its full path) and whose working directory is
    below ``under``: this test's tasks, not another run's on the same host."""
    program, _, args = cmdline.partition(b"\x00")
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                seen, _, seen_args = (entry / "cmdline").read_bytes().partition(b"\x00")
                if (
                    Path(seen.decode(errors="replace")).name == program.decode()
                    and seen_args == args + b"\x00"
                    and (entry / "cwd").resolve().is_relative_to(under.resolve())
                ):
                    found.append(entry.name)
            except OSError:
                continue  # the process ended while we looked
    return found


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def history(dsn: str, job_id: uuid.UUID) -> list[str]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT type FROM rm.job_events WHERE job_id = %s ORDER BY seq", (job_id,)
        )
        return [str(r[0]) for r in await cursor.fetchall()]


async def until_history_has(dsn: str, job_id: uuid.UUID, event: str, timeout_s: float) -> None:
    async with asyncio.timeout(timeout_s):
        while event not in await history(dsn, job_id):
            await asyncio.sleep(0.05)


@pytest.fixture
def site(secure_nats: SecureNats, tmp_path: Path) -> SiteSettings:
    return secure_site_dir(secure_nats, tmp_path)


async def test_sigkilled_launcher_jobs_are_recovered_by_another(
    secure_nats: SecureNats, database_url: str, site: SiteSettings, tmp_path: Path
) -> None:
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        ids = await submit(js, [
            job_created(SITE, OWNER, app="sleeper", workdir=f"s/{i}",
                        parameters={"seconds": "15"}, node_packing_count=4)
            for i in range(8)
        ])  # fmt: skip
        agent = spawn("agent", site, tmp_path / "agent.log")
        first = spawn("launcher", site, tmp_path / "l1.log")
        second = None
        try:
            await until_all(database_url, ids, "RUNNING", timeout_s=60)
            first.send_signal(signal.SIGKILL)
            first.wait()
            second = spawn("launcher", site, tmp_path / "l2.log")
            await until_all(database_url, ids, "JOB_FINISHED", timeout_s=120)
        finally:
            for proc in (first, second, agent):
                if proc is not None:
                    stop(proc)
    counts = await started_counts(database_url, ids)
    assert set(counts.values()) == {2}  # once by the killed pilot, once by its successor
    for job_id in ids:
        events = await history(database_url, job_id)
        assert events.count("job.run_timed_out") == 1
        # the successor's run is reported once: the job.finished that stands for its run_done
        assert events.count("job.run_done") == 0
        assert events.count("job.finished") == 1


async def test_deliveries_a_sigkilled_pilot_kept_unleased_run_once_elsewhere(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    """A full pilot keeps deliveries beside its slots (``launcher.prefetch``) without leasing
    them. Killed with them in hand it cannot hand them back: they come back when the launch
    feed's ack wait runs out, and its successor runs each of them once."""
    settings = secure_site_dir(secure_nats, tmp_path, virtual_nodes=1, cores_per_node=1, prefetch=2)
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        running, *kept = await submit(js, [
            job_created(SITE, OWNER, app="sleeper", workdir=f"p/{i}", parameters={"seconds": s})
            for i, s in enumerate(["20", "1", "1"])
        ])  # fmt: skip
        # The agent's timeout handler restarts the job the killed pilot was running.
        agent = spawn("agent", settings, tmp_path / "agent.log")
        first = spawn("launcher", settings, tmp_path / "l1.log")
        second = None
        try:
            await until_all(database_url, [running], "RUNNING", timeout_s=60)
            # The launch feed itself says the pilot holds the other two, unacknowledged.
            async with asyncio.timeout(30):
                while (
                    await js.consumer_info(LAUNCH.stream, LAUNCH.durable(SITE))
                ).num_ack_pending < 2:
                    await asyncio.sleep(0.02)
            first.send_signal(signal.SIGKILL)
            first.wait()
            assert await started_counts(database_url, kept) == {}  # kept is not leased
            second = spawn("launcher", settings, tmp_path / "l2.log")
            await until_all(database_url, kept, "JOB_FINISHED", timeout_s=LAUNCH.ack_wait_s + 60)
            await until_all(database_url, [running], "JOB_FINISHED", timeout_s=90)
        finally:
            for proc in (first, second, agent):
                if proc is not None:
                    stop(proc)
    assert "Traceback" not in (tmp_path / "l1.log").read_text()  # its warm template too
    assert await started_counts(database_url, kept) == dict.fromkeys(kept, 1)
    # The leased one: once by the killed pilot, timed out with its session, once by the next.
    assert await started_counts(database_url, [running]) == {running: 2}
    assert (await history(database_url, running)).count("job.run_timed_out") == 1


async def test_paused_launcher_is_fenced_and_kills_its_stale_task(
    secure_nats: SecureNats, database_url: str, site: SiteSettings, tmp_path: Path
) -> None:
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        [job] = await submit(js, [
            job_created(SITE, OWNER, app="sleeper", workdir="z", parameters={"seconds": "6"})
        ])  # fmt: skip
        zombie = spawn("launcher", site, tmp_path / "zombie.log")
        try:
            await until_all(database_url, [job], "RUNNING", timeout_s=60)
            zombie.send_signal(signal.SIGSTOP)
            # The heartbeat TTL (3 s) runs out; the controller times the run out (fencing).
            await until_all(database_url, [job], "RUN_TIMEOUT", timeout_s=30)
            zombie.send_signal(signal.SIGCONT)
            await asyncio.to_thread(zombie.wait, 30)
        finally:
            stop(zombie)
        # The zombie has exited, so nothing more of it can reach the log: once the read
        # model has everything the log holds, the job's history is final.
        everything = (await js.stream_info(EVENTS_STREAM)).state.last_seq
        await wait_for_position(database_url, everything, timeout_s=30)
    events = await history(database_url, job)
    assert events == ["job.created", "job.preprocessed", "job.started", "job.run_timed_out"]
    log = (tmp_path / "zombie.log").read_text()
    # Whichever notices first on waking: the session's expiry (every task killed), or the
    # periodic check of its running jobs (this one stopped: the controller moved it on).
    assert "killing job" in log or "job.run_timed_out (found by the periodic check)" in log
    assert "1 fenced" in log


async def test_killing_a_running_job_stops_its_task(
    secure_nats: SecureNats, database_url: str, site: SiteSettings, tmp_path: Path
) -> None:
    async with control_plane(secure_nats, database_url) as js:
        log = EventLog(js)
        await log.append(site_registered(SITE, OWNER), expect=0)
        [job] = await submit(js, [
            job_created(SITE, OWNER, app="sleeper", workdir="k", parameters={"seconds": "60"})
        ])  # fmt: skip
        pilot = spawn("launcher", site, tmp_path / "pilot.log")
        try:
            await until_all(database_url, [job], "RUNNING", timeout_s=60)
            async with asyncio.timeout(30):  # the task we are about to kill is seen running
                while not await asyncio.to_thread(processes_running, b"sleep\x0060", tmp_path):
                    await asyncio.sleep(0.1)
            async with await psycopg.AsyncConnection.connect(database_url) as conn:
                cursor = await conn.execute("SELECT last_seq FROM rm.jobs WHERE id = %s", (job,))
                (last,) = await cursor.fetchone() or (0,)
            kill = JobKilled.create(site=SITE, aggregate_id=job, actor=f"user:{OWNER}")
            await log.append(kill, expect=int(last))
            await until_all(database_url, [job], "KILLED", timeout_s=20)
            await asyncio.sleep(1.0)
            sleepers = await asyncio.to_thread(processes_running, b"sleep\x0060", tmp_path)
            assert sleepers == []
        finally:
            stop(pilot)
    assert (await history(database_url, job))[-1] == "job.killed"
