"""A task that dies as its pilot is told to stop: a timeout with the cause chain, not an error.

A scheduler that stops a batch job (``scancel``, preemption, its time limit) signals the
job's steps and the pilot at once, and the task may die before the pilot hears of it. Here
the task kills itself with SIGTERM, and the test then stops the pilot (its SIGTERM handler
sets the same event): the run is ``job.run_timed_out``. The control is the same task with
no stop to follow: its death is the job's own error (the real scheduler's version is in
``test_slurm_stops.py``).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from lodestream.agents.launcher.main import run as run_launcher
from lodestream.eventlog import EventLog
from tests.fixtures.nats import SecureNats
from tests.integration.test_launcher import OWNER, SITE, control_plane, submit, until_all
from tests.support.builders import job_created, site_registered
from tests.support.site import secure_site_dir

pytestmark = pytest.mark.slow  # the control waits out the window in which a stop may follow

DIES = '''
from lodestream.agents.site.apps import ApplicationDefinition


class DiesOfSigterm(ApplicationDefinition):
    """Says it is up, waits to be let go, then dies of SIGTERM as a scheduler's step would."""

    name = "dies"
    command_template = (
        "touch ../{{ me }}.up; while [ ! -e ../{{ me }}.go ]; do sleep 0.05; done; "
        "touch ../{{ me }}.dying; kill -TERM $$"
    )
'''


async def until_file(path: Path, timeout_s: float = 30) -> None:
    async with asyncio.timeout(timeout_s):
        while not await asyncio.to_thread(path.exists):
            await asyncio.sleep(0.05)


async def events_of(dsn: str, job: uuid.UUID) -> list[tuple[str, dict[str, Any]]]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT type, data FROM rm.job_events WHERE job_id = %s ORDER BY seq", (job,)
        )
        return [(str(t), dict(d)) for t, d in await cursor.fetchall()]


async def test_a_task_that_dies_just_before_its_pilot_is_stopped_timed_out(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    settings = secure_site_dir(secure_nats, tmp_path)
    (settings.apps_dir / "dies.py").write_text(DIES)
    work = settings.data_dir / "stops"
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        alone, stopped = await submit(js, [
            job_created(SITE, OWNER, app="dies", workdir=f"stops/{me}", parameters={"me": me})
            for me in ("alone", "stopped")
        ])  # fmt: skip
        stop = asyncio.Event()
        pilot = asyncio.create_task(run_launcher(settings.directory, wall_time_min=10, stop=stop))
        await until_file(work / "alone.up")
        await until_file(work / "stopped.up")

        # The control: a task that dies of a signal with no stop to follow failed.
        (work / "alone.go").touch()
        await until_all(database_url, [alone], "RUN_ERROR")

        # The same death, and then the pilot is told to stop.
        (work / "stopped.go").touch()
        await until_file(work / "stopped.dying")
        await asyncio.sleep(0.3)  # most likely dead by now; dead or not, it is the stop's
        stop.set()
        report = await asyncio.wait_for(pilot, 60)
        await until_all(database_url, [stopped], "RUN_TIMEOUT")

    assert (report.errored, report.timed_out) == (1, 1)
    [(kind, data)] = [e for e in await events_of(database_url, alone) if e[0].startswith("job.run")]
    assert (kind, data["return_code"]) == ("job.run_errored", -15)
    history = await events_of(database_url, stopped)
    [(kind, data)] = [e for e in history if e[0].startswith("job.run")]
    [session] = [d["session_id"] for t, d in history if t == "job.started"]
    assert (kind, data["return_code"]) == ("job.run_timed_out", -15)
    assert data["cause"] == [
        "the task ended (return code -15) as its pilot was told to stop",
        f"launcher {session} drained: stopped",
    ]
