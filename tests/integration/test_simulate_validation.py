"""The what-if simulator against the real stack (issue 14's acceptance test).

Record a run of 60 sleeps on one pilot with 2 slots, predict the makespan with twice the
slots from that recording alone, run it with twice the slots, and compare: the prediction
must be within 15 % of what was measured.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import psycopg
from nats.js import JetStreamContext

from lodestream.agents.launcher.main import run as run_launcher
from lodestream.client.analytics.simulate.calibrate import calibrate
from lodestream.client.analytics.simulate.engine import simulate
from lodestream.client.analytics.simulate.model import Scenario
from lodestream.client.analytics.simulate.recorded import recording
from lodestream.client.analytics.simulate.source import Refusals, from_lines
from lodestream.eventlog import EventLog
from lodestream.schemas.subjects import EVENTS_STREAM
from tests.fixtures.nats import SecureNats
from tests.integration.test_launcher import OWNER, SITE, control_plane, submit, until_all
from tests.support.builders import job_created, site_registered
from tests.support.site import secure_site_dir

JOBS = 60
TOLERANCE = 0.15


def seconds(i: int) -> str:
    # 0.2 to 0.5 s, spread over the jobs in no particular order.
    return f"{0.2 + 0.3 * ((i * 37) % JOBS) / JOBS:.3f}"


async def last_seq(js: JetStreamContext) -> int:
    return int((await js.stream_info(EVENTS_STREAM)).state.last_seq)


async def dump(js: JetStreamContext, first: int, last: int, path: Path) -> None:
    """The log's events in (first, last], one JSON line each, with the subject it was on."""
    with path.open("wb") as out:
        for seq in range(first + 1, last + 1):
            msg = await js.get_msg(EVENTS_STREAM, seq)
            assert msg.data is not None
            out.write(orjson.dumps({"subject": msg.subject, **orjson.loads(msg.data)}) + b"\n")


async def session_open(dsn: str, count: int) -> None:
    async with asyncio.timeout(30):
        while True:
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                cursor = await conn.execute("SELECT count(*) FROM rm.sessions WHERE site = %s",
                                            (SITE,))  # fmt: skip
                row = await cursor.fetchone()
            if row is not None and int(row[0]) >= count:
                return
            await asyncio.sleep(0.05)


async def one_run(js: JetStreamContext, dsn: str, site_dir: Path, run: int, path: Path) -> None:
    """Start a pilot, wait for its session, submit the jobs, wait for them all; record."""
    first = await last_seq(js)
    stop = asyncio.Event()
    launcher = asyncio.create_task(run_launcher(site_dir, wall_time_min=10, stop=stop))
    await session_open(dsn, run)
    # A node's cores are its slots: up to 8 such jobs may share one.
    jobs = [job_created(SITE, OWNER, app="sleeper", workdir=f"r{run}/{i}", node_packing_count=8,
                        parameters={"seconds": seconds(i)}) for i in range(JOBS)]  # fmt: skip
    ids = await submit(js, jobs)
    await until_all(dsn, ids, "JOB_FINISHED", timeout_s=120)
    stop.set()
    await asyncio.wait_for(launcher, 30)
    await dump(js, first, await last_seq(js), path)


def makespan_and_prediction(path: Path, slots: int | None) -> tuple[float, float]:
    refusals = Refusals()
    with path.open("rb") as lines:
        cal = calibrate(recording(from_lines(lines, refusals)))
    assert refusals.count == 0, refusals.first
    assert len(cal.jobs) == JOBS
    return cal.makespan_s, simulate(cal, Scenario(slots=slots)).makespan_s


async def test_a_prediction_with_twice_the_slots_is_within_15_percent_of_the_measured(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    two = secure_site_dir(secure_nats, tmp_path / "two", virtual_nodes=1, cores_per_node=2)
    four = secure_site_dir(secure_nats, tmp_path / "four", virtual_nodes=1, cores_per_node=4)
    async with control_plane(secure_nats, database_url) as js:
        await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
        await one_run(js, database_url, two.directory, 1, tmp_path / "two.jsonl")
        await one_run(js, database_url, four.directory, 2, tmp_path / "four.jsonl")
    recorded, replayed = makespan_and_prediction(tmp_path / "two.jsonl", None)
    _, predicted = makespan_and_prediction(tmp_path / "two.jsonl", 4)
    measured, _ = makespan_and_prediction(tmp_path / "four.jsonl", None)
    error = (predicted - measured) / measured
    print(  # the figures for the closing note
        f"\n| run | makespan (s) |\n|---|---|\n"
        f"| recorded, 1 pilot x 2 slots | {recorded:.3f} |\n"
        f"| replayed by the model at 2 slots | {replayed:.3f} |\n"
        f"| predicted, 4 slots | {predicted:.3f} |\n"
        f"| measured, 4 slots | {measured:.3f} |\n"
        f"| error of the prediction | {error:+.1%} |"
    )
    assert abs(error) <= TOLERANCE
