"""The what-if simulator against the real stack (issues 14 and 35's acceptance tests).

Record a run on one pilot, predict the makespan with more capacity from that recording
alone, run it with that capacity, and compare: the prediction must be within 15 % of what
was measured, and replaying the recording unchanged within 2 % of it (with and without
the I/O term). Issue 14: 60 sleeps, twice the slots. Issue 35: a workload with structure
(sleeps in waves, jobs that fail once and retry, one that fails for good, a 3-job chain)
on one pilot of 2 nodes x 2 slots, predicted for two pilots.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import orjson
import psycopg
import pytest
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from lodestream.agents.launcher.main import run as run_launcher
from lodestream.agents.site.main import run as run_site_agent
from lodestream.client.analytics.simulate.calibrate import IOModel, calibrate
from lodestream.client.analytics.simulate.engine import simulate
from lodestream.client.analytics.simulate.model import Scenario
from lodestream.client.analytics.simulate.recorded import recording
from lodestream.client.analytics.simulate.source import Refusals, from_lines
from lodestream.eventlog import EventLog
from lodestream.schemas.envelope import Event
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.schemas.topology import SITE_CONSUMERS
from tests.fixtures.nats import SecureNats
from tests.integration.test_launcher import OWNER, SITE, control_plane, submit, until_all
from tests.support.builders import job_created, site_registered
from tests.support.site import secure_site_dir

# The model's error is measured against a real run's makespan, which a second test process
# on the same two cores stretches unevenly (a full run saw +22 % and +44 %): these run after
# the parallel part of `make test`, one at a time.
pytestmark = pytest.mark.alone
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


async def site_ready(js: JetStreamContext) -> None:
    """Register the site and wait for its consumers, which the controller makes when it sees
    the registration. A pilot started before then sends its first pull request to a
    consumer that does not exist yet, gets no answer, and fetches again only once that
    request's window has run out (its expiry and a second): the first run then leased its
    first job 1.2 to 1.5 s late, the second run (consumers there) at once, and the
    prediction made from the first carried that start into the second (+20 % and +50 %)."""
    await EventLog(js).append(site_registered(SITE, OWNER), expect=0)
    async with asyncio.timeout(30):
        for feed in SITE_CONSUMERS:
            while True:
                try:
                    await js.consumer_info(feed.stream, feed.durable(SITE))
                    break
                except NotFoundError:
                    await asyncio.sleep(0.05)


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
        await site_ready(js)
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


# A pilot keeps up to two jobs it cannot place yet (launcher.prefetch) and places them the
# moment a node frees; the model does the same, and hands a job back round the pilot's
# nak cycle only beyond those (or after 2 s kept). Replays then hold within 2 %.
REPLAY_TOLERANCE = 0.02


def mixed(run: int) -> list[Event]:
    """Sleeps in three waves of four, two jobs that fail once, one that fails for good, and a
    chain of three: 18 jobs, in the order they are submitted."""
    jobs: list[Event] = []
    for i in range(12):
        seconds = f"{0.4 + 0.1 * (i % 4):.1f}"
        jobs.append(job_created(SITE, OWNER, app="sleeper", workdir=f"m{run}/s{i}",
                                node_packing_count=2, parameters={"seconds": seconds}))  # fmt: skip
    for i in range(2):
        jobs.append(job_created(SITE, OWNER, app="flaky", workdir=f"m{run}/f{i}",
                                parameters={"tag": str(i)}))  # fmt: skip
    jobs.append(job_created(SITE, OWNER, app="fails", workdir=f"m{run}/x",
                            parameters={"why": "no"}))  # fmt: skip
    parent: uuid.UUID | None = None
    for i in range(3):
        link = job_created(SITE, OWNER, app="sleeper", workdir=f"m{run}/c{i}",
                           parameters={"seconds": "0.5"}, node_packing_count=2,
                           parent_ids=(parent,) if parent is not None else ())  # fmt: skip
        jobs.append(link)
        parent = link.aggregate_id
    return jobs


async def mixed_run(
    js: JetStreamContext, dsn: str, site_dir: Path, sessions: int, pilots: int, path: Path
) -> None:
    """``pilots`` pilots and the site's agent (it decides the retries) run :func:`mixed`."""
    first = await last_seq(js)
    stop = asyncio.Event()
    tasks: list[asyncio.Task[object]] = [asyncio.create_task(run_site_agent(site_dir, stop=stop))]
    tasks += [asyncio.create_task(run_launcher(site_dir, wall_time_min=10, stop=stop))
              for _ in range(pilots)]  # fmt: skip
    await session_open(dsn, sessions)
    jobs = mixed(sessions)
    ids = await submit(js, jobs)  # type: ignore[arg-type]
    doomed = [e.aggregate_id for e in jobs if e.data.app == "fails"]  # type: ignore[attr-defined]
    await until_all(dsn, [i for i in ids if i not in doomed], "JOB_FINISHED", timeout_s=120)
    await until_all(dsn, doomed, "FAILED", timeout_s=120)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    await dump(js, first, await last_seq(js), path)


def replayed_and_predicted(
    path: Path, scenario: Scenario, io: IOModel | None = None
) -> tuple[float, float, float]:
    """The recorded makespan, the model's replay of it, its prediction for ``scenario``."""
    refusals = Refusals()
    with path.open("rb") as lines:
        cal = calibrate(recording(from_lines(lines, refusals)), io)
    assert refusals.count == 0, refusals.first
    return cal.makespan_s, simulate(cal, Scenario()).makespan_s, simulate(cal, scenario).makespan_s


async def test_a_workload_with_retries_and_a_chain_predicted_for_two_pilots(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    # One pilot is 2 nodes x 2 cores: two sleepers share a node, so 4 run at once.
    site = secure_site_dir(secure_nats, tmp_path, virtual_nodes=2, cores_per_node=2)
    async with control_plane(secure_nats, database_url) as js:
        await site_ready(js)
        await mixed_run(js, database_url, site.directory, 1, 1, tmp_path / "one.jsonl")
        await mixed_run(js, database_url, site.directory, 3, 2, tmp_path / "two.jsonl")
    recorded, replayed, predicted = replayed_and_predicted(tmp_path / "one.jsonl",
                                                           Scenario(pilots=2))  # fmt: skip
    _, with_io, _ = replayed_and_predicted(tmp_path / "one.jsonl", Scenario(),
                                           IOModel(0.5, 1e9))  # fmt: skip
    measured, _, _ = replayed_and_predicted(tmp_path / "two.jsonl", Scenario())
    error = (predicted - measured) / measured
    print(  # the figures for the closing note
        f"\n| mixed workload | makespan (s) |\n|---|---|\n"
        f"| recorded, 1 pilot x 2 nodes x 2 slots | {recorded:.3f} |\n"
        f"| replayed by the model | {replayed:.3f} ({(replayed - recorded) / recorded:+.1%}) |\n"
        f"| replayed, I/O term 0.5 at 1e9 B/s | {with_io:.3f} |\n"
        f"| predicted, 2 pilots | {predicted:.3f} |\n"
        f"| measured, 2 pilots | {measured:.3f} |\n"
        f"| error of the prediction | {error:+.1%} |"
    )
    assert abs(error) <= TOLERANCE
    assert abs(replayed - recorded) <= REPLAY_TOLERANCE * recorded
    assert abs(with_io - recorded) <= REPLAY_TOLERANCE * recorded
