"""The what-if simulator against the real stack (issues 14 and 35's acceptance tests).

Record a run on one pilot, predict the makespan with more capacity from that recording
alone, run it with that capacity, and compare: the prediction must be within 15 % of what
was measured, and replaying the recording unchanged within 2 % of it (with and without
the I/O term). Issue 14: 60 sleeps, twice the slots. Issue 35: a workload with structure
(sleeps in waves, jobs that fail once and retry, one that fails for good, a 3-job chain)
and a workload that stages its files in and out through the site's transfer module, each
on one pilot of 2 nodes x 2 slots, predicted for two pilots. The structured workload is
also run on four pilots; that prediction is printed, not asserted (bench/RESULTS.md,
2026-12-07: on two shared cores, four pilots and the control plane slow each other).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from functools import partial
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
from lodestream.schemas.resources import TransferSpec
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.schemas.topology import SITE_CONSUMERS
from tests.fixtures.nats import SecureNats
from tests.integration.test_launcher import OWNER, SITE, control_plane, submit, until_all
from tests.integration.test_staging import app_known
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


async def structured_run(
    js: JetStreamContext, dsn: str, site_dir: Path, sessions: int, pilots: int, path: Path,
    workload: Callable[[], list[Event]], app: str = "sleeper",
) -> None:  # fmt: skip
    """``pilots`` pilots and the site's agent (it decides the retries, it moves the staged
    files) run ``workload``, made and submitted once the pilots' sessions are open and the
    agent has declared ``app`` (a job's creation is the recording's start)."""
    first = await last_seq(js)
    stop = asyncio.Event()
    tasks: list[asyncio.Task[object]] = [asyncio.create_task(run_site_agent(site_dir, stop=stop))]
    tasks += [asyncio.create_task(run_launcher(site_dir, wall_time_min=10, stop=stop))
              for _ in range(pilots)]  # fmt: skip
    await session_open(dsn, sessions)
    await app_known(dsn, app)
    jobs = workload()
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


async def test_a_workload_with_retries_and_a_chain_predicted_for_two_and_four_pilots(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    # One pilot is 2 nodes x 2 cores: two sleepers share a node, so 4 run at once.
    site = secure_site_dir(secure_nats, tmp_path, virtual_nodes=2, cores_per_node=2)
    async with control_plane(secure_nats, database_url) as js:
        await site_ready(js)
        for pilots, sessions, name in ((1, 1, "one"), (2, 3, "two"), (4, 7, "four")):
            await structured_run(js, database_url, site.directory, sessions, pilots,
                                 tmp_path / f"{name}.jsonl", partial(mixed, sessions))  # fmt: skip
    one = tmp_path / "one.jsonl"
    recorded, replayed, predicted = replayed_and_predicted(one, Scenario(pilots=2))
    _, _, predicted_four = replayed_and_predicted(one, Scenario(pilots=4))
    _, with_io, _ = replayed_and_predicted(one, Scenario(), IOModel(0.5, 1e9))
    measured, _, _ = replayed_and_predicted(tmp_path / "two.jsonl", Scenario())
    measured_four, _, _ = replayed_and_predicted(tmp_path / "four.jsonl", Scenario())
    error = (predicted - measured) / measured
    error_four = (predicted_four - measured_four) / measured_four
    print(  # the figures for the closing note
        f"\n| mixed workload | makespan (s) |\n|---|---|\n"
        f"| recorded, 1 pilot x 2 nodes x 2 slots | {recorded:.3f} |\n"
        f"| replayed by the model | {replayed:.3f} ({(replayed - recorded) / recorded:+.1%}) |\n"
        f"| replayed, I/O term 0.5 at 1e9 B/s | {with_io:.3f} |\n"
        f"| predicted, 2 pilots | {predicted:.3f} |\n"
        f"| measured, 2 pilots | {measured:.3f} |\n"
        f"| error of the prediction, 2 pilots | {error:+.1%} |\n"
        f"| predicted, 4 pilots | {predicted_four:.3f} |\n"
        f"| measured, 4 pilots | {measured_four:.3f} |\n"
        f"| error of the prediction, 4 pilots | {error_four:+.1%} |"
    )
    assert abs(error) <= TOLERANCE
    assert abs(replayed - recorded) <= REPLAY_TOLERANCE * recorded
    assert abs(with_io - recorded) <= REPLAY_TOLERANCE * recorded


# Staging: each job's input moves in through the site's transfer module (the local backend)
# before it may run, and its output moves out before it is finished. The module picks an
# item up and reports it at the ends of its fetches (up to 0.5 s each), so a step takes
# 0.2 to 1 s whatever its bytes, and what the stage-in and the last stage-out draw is
# chance, up to about 2 s between two runs: 128 jobs make the makespan (11 to 20 s) long
# enough for that to stay within the 15 % (10 runs: -14.4 % to +4.2 %); 16 or 32 jobs
# missed by up to 28 %, 64 by up to 17 % (bench/RESULTS.md, 2026-12-07).
STAGED = 128
STAGED_BYTES = 1024 * 1024
STAGED_APP = '''from lodestream.agents.site.apps import ApplicationDefinition


class Staged(ApplicationDefinition):
    """Reads its staged-in input, sleeps, writes it out to be staged out."""

    name = "staged"
    command_template = "sleep {{ seconds }} && mkdir -p out && cp in/data.bin out/data.bin"
    transfers = {
        "data": {"direction": "in", "local_path": "in/data.bin", "required": True},
        "result": {"direction": "out", "local_path": "out/data.bin"},
    }
'''


def staged(run: int, store: Path) -> list[Event]:
    """128 jobs, each its own 1 MB input staged in and its output staged out, 0.4 to 0.7 s
    of run between."""
    for i in range(STAGED):  # before the jobs are made: they are submitted at one moment
        (store / f"in-{run}-{i}.bin").write_bytes(bytes([i]) * STAGED_BYTES)
    jobs: list[Event] = []
    for i in range(STAGED):
        moves = {"data": TransferSpec(location="store", path=f"/in-{run}-{i}.bin"),
                 "result": TransferSpec(location="store", path=f"/out/{run}-{i}.bin")}  # fmt: skip
        jobs.append(job_created(SITE, OWNER, app="staged", workdir=f"t{run}/{i}",
                                node_packing_count=2, transfers=moves,
                                parameters={"seconds": f"{0.4 + 0.1 * (i % 4):.1f}"}))  # fmt: skip
    return jobs


async def test_a_staging_workload_predicted_for_two_pilots(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    (store / "out").mkdir(parents=True)
    transfers = {"locations": {"store": f"local:{store}"}, "poll_interval_s": 0.1}
    site = secure_site_dir(secure_nats, tmp_path, virtual_nodes=2, cores_per_node=2,
                           transfers=transfers)  # fmt: skip
    (site.directory / "apps" / "staged.py").write_text(STAGED_APP)
    async with control_plane(secure_nats, database_url) as js:
        await site_ready(js)
        for pilots, sessions, name in ((1, 1, "one"), (2, 3, "two")):
            await structured_run(js, database_url, site.directory, sessions, pilots,
                                 tmp_path / f"{name}.jsonl", partial(staged, sessions, store),
                                 "staged")  # fmt: skip
    assert len(list((store / "out").iterdir())) == 2 * STAGED
    one = tmp_path / "one.jsonl"
    recorded, replayed, predicted = replayed_and_predicted(one, Scenario(pilots=2))
    measured, _, _ = replayed_and_predicted(tmp_path / "two.jsonl", Scenario())
    error = (predicted - measured) / measured
    print(  # the figures for the closing note
        f"\n| staging workload | makespan (s) |\n|---|---|\n"
        f"| recorded, 1 pilot x 2 nodes x 2 slots | {recorded:.3f} |\n"
        f"| replayed by the model | {replayed:.3f} ({(replayed - recorded) / recorded:+.1%}) |\n"
        f"| predicted, 2 pilots | {predicted:.3f} |\n"
        f"| measured, 2 pilots | {measured:.3f} |\n"
        f"| error of the prediction | {error:+.1%} |"
    )
    assert abs(error) <= TOLERANCE
    assert abs(replayed - recorded) <= REPLAY_TOLERANCE * recorded
