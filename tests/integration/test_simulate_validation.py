"""The what-if simulator against the real stack (issues 14 and 35's acceptance tests).

Record a workload run on one pilot, predict its makespan with more capacity from that
recording alone, run it with that capacity, and compare: each prediction must be within
15 % of what was measured, and replaying the recording unchanged within 2 % of it, with and
without the I/O term. Three workloads, each recorded on one pilot and predicted for two
and for four: independent sleeps (also for twice the slots, issue 14); sleeps in waves
with jobs that fail once and retry, one that fails for good and a 3-job chain; and jobs
that stage their files in and out through the site's transfer module.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import orjson
import psycopg
import pytest
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from lodestream.client.analytics.simulate.calibrate import Calibration, IOModel, calibrate
from lodestream.client.analytics.simulate.engine import simulate
from lodestream.client.analytics.simulate.model import Scenario
from lodestream.client.analytics.simulate.recorded import recording
from lodestream.client.analytics.simulate.source import Refusals, from_lines
from lodestream.eventlog import EventLog
from lodestream.schemas.envelope import Event
from lodestream.schemas.events.job import CreatedData, JobCreated
from lodestream.schemas.resources import TransferSpec
from lodestream.schemas.states import CREATED_RUNNABLE
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.schemas.topology import LAUNCH, SITE_CONSUMERS
from lodestream.services.api.models import JobSubmission
from lodestream.services.api.submit import AppInterface, created_runnable
from tests.fixtures.nats import SecureNats
from tests.integration.test_launcher import OWNER, SITE, control_plane, submit, until_all
from tests.integration.test_staging import app_known
from tests.support.builders import job_created, site_registered
from tests.support.chaos import Child
from tests.support.site import secure_site_dir

# The model's error is measured against a real run's makespan, which a second test process
# on the same two cores stretches unevenly (a full run saw +22 % and +44 %): these run after
# the parallel part of `make test`, one at a time.
pytestmark = pytest.mark.alone
TOLERANCE = 0.15
# A pilot keeps up to two jobs it cannot place yet (launcher.prefetch) and places them the
# moment a node frees; the model does the same, and hands a job back round the pilot's
# nak cycle only beyond those (or after 2 s kept). Replays then hold within 2 %.
REPLAY_TOLERANCE = 0.02
IO_TERM = IOModel(0.5, 1e9)  # half of each run reading from storage at 1 GB/s

Workload = Callable[[int], list[Event]]


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


async def site_apps(dsn: str) -> dict[str, AppInterface]:
    """The site's apps as the API reads them from the read model."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT name, parameters, transfers, hooks, python FROM rm.apps WHERE site = %s",
            (SITE,),
        )
        rows = await cursor.fetchall()
    return {name: AppInterface.from_row(*row) for name, *row in rows}


def as_the_api_creates(event: Event, apps: dict[str, AppInterface]) -> Event:
    """``event`` (a ``job.created``) as the API appends it: created runnable when the API's
    own rule says so (no parents, nothing to stage, no ``preprocess`` hook at its app). Such
    a job goes to the pilots from its creation, with no step of the controller's between; a
    job appended as the builders make it waits for the controller, and its creation reaches
    the pilots too, which ack it (a recording made so is not the run a user's submission
    makes)."""
    assert isinstance(event, JobCreated)
    submission = JobSubmission.model_validate(event.data.model_dump())
    if not created_runnable(submission, apps.get(event.data.app)):
        return event
    data = CreatedData.model_validate({**event.data.model_dump(), "skipped": CREATED_RUNNABLE})
    return JobCreated.create(site=event.site, aggregate_id=event.aggregate_id,
                             actor=event.actor, data=data)  # fmt: skip


async def fetching(js: JetStreamContext, pilots: int) -> None:
    """Wait until ``pilots`` pull requests wait on the site's launch feed: each pilot is
    fetching (a session opens before its pilot's first fetch), as the recording's pilots
    were once its jobs came."""
    async with asyncio.timeout(30):
        while (await js.consumer_info(LAUNCH.stream, LAUNCH.durable(SITE))).num_waiting < pilots:
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def site_processes(site_dir: Path, pilots: int, logs: Path) -> AsyncIterator[None]:
    """The site's agent (it decides the retries, it moves the staged files) and ``pilots``
    pilots, each its own process, as at a site (in the test's process they would share one
    event loop with each other and with the projector and the controller)."""
    await asyncio.to_thread(logs.mkdir, parents=True, exist_ok=True)
    cli = [sys.executable, "-m", "lodestream.client.cli.main"]
    children = [Child("agent", [*cli, "site", "start", str(site_dir)], dict(os.environ), logs)]
    children += [Child(f"pilot-{n}", [*cli, "launcher", "--site", str(site_dir),
                                      "--wall-time-min", "10"], dict(os.environ), logs)
                 for n in range(pilots)]  # fmt: skip
    for child in children:
        child.start()
    try:
        yield
    finally:
        await asyncio.gather(*(asyncio.to_thread(child.stop) for child in children))
    for child in children:
        assert child.proc is not None
        assert child.proc.returncode == 0, f"{child.name}:\n{child.log_tail()}"


async def recorded_run(
    js: JetStreamContext, dsn: str, run: Run, sessions: int, workload: Callable[[], list[Event]],
    path: Path, app: str,
) -> None:  # fmt: skip
    """Run ``workload`` on the run's pilots (:func:`site_processes`), made and submitted
    once the site has had ``sessions`` sessions open and its agent has declared ``app`` (a
    job's creation is the recording's start); record it in ``path``."""
    first = await last_seq(js)
    async with site_processes(run.site_dir, run.pilots, path.with_suffix(".logs")):
        await session_open(dsn, sessions)
        await fetching(js, run.pilots)
        await app_known(dsn, app)
        apps = await site_apps(dsn)
        jobs = [as_the_api_creates(e, apps) for e in workload()]
        ids = await submit(js, jobs)  # type: ignore[arg-type]
        doomed = [e.aggregate_id for e in jobs if e.data.app == "fails"]  # type: ignore[attr-defined]
        await until_all(dsn, [i for i in ids if i not in doomed], "JOB_FINISHED", timeout_s=120)
        await until_all(dsn, doomed, "FAILED", timeout_s=120)
    await dump(js, first, await last_seq(js), path)


@dataclass(frozen=True, slots=True)
class Run:
    """One run of a workload for real, recorded in ``name``.jsonl."""

    name: str
    site_dir: Path
    pilots: int


async def record_runs(
    secure_nats: SecureNats, dsn: str, tmp_path: Path, runs: Sequence[Run], workload: Workload,
    app: str = "sleeper",
) -> None:  # fmt: skip
    """Run ``workload`` once per run, in turn, against one control plane."""
    sessions = 0
    async with control_plane(secure_nats, dsn) as js:
        await site_ready(js)
        for run in runs:
            sessions += run.pilots
            await recorded_run(js, dsn, run, sessions, partial(workload, sessions),
                               tmp_path / f"{run.name}.jsonl", app)  # fmt: skip


def calibrated(path: Path, jobs: int, io: IOModel | None = None) -> Calibration:
    refusals = Refusals()
    with path.open("rb") as lines:
        cal = calibrate(recording(from_lines(lines, refusals)), io)
    assert refusals.count == 0, refusals.first
    assert len(cal.jobs) == jobs
    return cal


def check_predictions(
    tmp_path: Path, title: str, jobs: int, predictions: dict[str, tuple[str, Scenario]]
) -> None:
    """The recording ``one`` replayed with and without the I/O term, and its prediction for
    each named run's scenario against that run's makespan: print them, then hold them to
    the bounds."""
    one = calibrated(tmp_path / "one.jsonl", jobs)
    replays = {"replayed by the model": simulate(one, Scenario()).makespan_s,
               "replayed, I/O term 0.5 at 1e9 B/s":
                   simulate(calibrated(tmp_path / "one.jsonl", jobs, IO_TERM),
                            Scenario()).makespan_s}  # fmt: skip
    rows = [f"| {title} | makespan (s) | error |", "|---|---|---|",
            f"| recorded, 1 pilot | {one.makespan_s:.3f} | |"]  # fmt: skip
    rows += [f"| {label} | {s:.3f} | {(s - one.makespan_s) / one.makespan_s:+.1%} |"
             for label, s in replays.items()]  # fmt: skip
    errors: dict[str, float] = {}
    for name, (label, scenario) in predictions.items():
        predicted = simulate(one, scenario).makespan_s
        measured = calibrated(tmp_path / f"{name}.jsonl", jobs).makespan_s
        errors[label] = (predicted - measured) / measured
        rows.append(f"| {label}: predicted / measured | {predicted:.3f} / {measured:.3f} "
                    f"| {errors[label]:+.1%} |")  # fmt: skip
    print("\n" + "\n".join(rows))  # the figures for the closing note and bench/RESULTS.md
    for label, replayed in replays.items():
        assert abs(replayed - one.makespan_s) <= REPLAY_TOLERANCE * one.makespan_s, label
    for label, error in errors.items():
        assert abs(error) <= TOLERANCE, f"{label}: {error:+.1%}"


MORE_PILOTS = {"two": ("2 pilots", Scenario(pilots=2)), "four": ("4 pilots", Scenario(pilots=4))}


JOBS = 60


def seconds(i: int) -> str:
    # 0.2 to 0.5 s, spread over the jobs in no particular order.
    return f"{0.2 + 0.3 * ((i * 37) % JOBS) / JOBS:.3f}"


def independent(run: int) -> list[Event]:
    """60 sleeps of 0.2 to 0.5 s; a node's cores are its slots: up to 8 such jobs may share
    one."""
    return [job_created(SITE, OWNER, app="sleeper", workdir=f"r{run}/{i}", node_packing_count=8,
                        parameters={"seconds": seconds(i)}) for i in range(JOBS)]  # fmt: skip


async def test_independent_jobs_predicted_for_more_pilots_and_twice_the_slots(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    two = secure_site_dir(secure_nats, tmp_path / "two-slots", virtual_nodes=1, cores_per_node=2)
    four = secure_site_dir(secure_nats, tmp_path / "four-slots", virtual_nodes=1,
                           cores_per_node=4)  # fmt: skip
    runs = [Run("one", two.directory, 1), Run("two", two.directory, 2),
            Run("four", two.directory, 4), Run("slots", four.directory, 1)]  # fmt: skip
    await record_runs(secure_nats, database_url, tmp_path, runs, independent)
    check_predictions(tmp_path, "independent jobs, 1 x 1 x 2", JOBS,
                      {**MORE_PILOTS, "slots": ("4 slots", Scenario(slots=4))})  # fmt: skip


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


async def test_a_workload_with_retries_and_a_chain_predicted_for_two_and_four_pilots(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    # One pilot is 2 nodes x 2 cores: two sleepers share a node, so 4 run at once.
    site = secure_site_dir(secure_nats, tmp_path, virtual_nodes=2, cores_per_node=2)
    runs = [Run(name, site.directory, pilots) for name, pilots in PILOTS]
    await record_runs(secure_nats, database_url, tmp_path, runs, mixed)
    check_predictions(tmp_path, "mixed workload, 1 x 2 x 2", len(mixed(0)), MORE_PILOTS)


PILOTS = (("one", 1), ("two", 2), ("four", 4))


# Staging: each job's input moves in through the site's transfer module (the local backend)
# before it may run, and its output moves out before it is finished. What the stage-in of
# all 128 inputs and the last job's stage-out take is chance, a few tenths of a second each
# way between two runs (the copies and the module's polls share two cores with everything
# else): the stage-in took 0.5 to 1.2 s in recordings of one pilot and of four, the last
# stage-out 0.2 to 1.1 s. With 0.4 to 0.7 s runs the four-pilot makespan was 6 to 8 s and
# its prediction missed by up to 13.6 %; with runs twice as long it is 10 to 12 s
# (bench/RESULTS.md, 2026-12-07).
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
    """128 jobs, each its own 1 MB input staged in and its output staged out, 0.8 to 1.4 s
    of run between."""
    for i in range(STAGED):  # before the jobs are made: they are submitted at one moment
        (store / f"in-{run}-{i}.bin").write_bytes(bytes([i]) * STAGED_BYTES)
    jobs: list[Event] = []
    for i in range(STAGED):
        moves = {"data": TransferSpec(location="store", path=f"/in-{run}-{i}.bin"),
                 "result": TransferSpec(location="store", path=f"/out/{run}-{i}.bin")}  # fmt: skip
        jobs.append(job_created(SITE, OWNER, app="staged", workdir=f"t{run}/{i}",
                                node_packing_count=2, transfers=moves,
                                parameters={"seconds": f"{0.8 + 0.2 * (i % 4):.1f}"}))  # fmt: skip
    return jobs


async def test_a_staging_workload_predicted_for_two_and_four_pilots(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    (store / "out").mkdir(parents=True)
    transfers = {"locations": {"store": f"local:{store}"}, "poll_interval_s": 0.1}
    site = secure_site_dir(secure_nats, tmp_path, virtual_nodes=2, cores_per_node=2,
                           transfers=transfers)  # fmt: skip
    (site.directory / "apps" / "staged.py").write_text(STAGED_APP)
    runs = [Run(name, site.directory, pilots) for name, pilots in PILOTS]
    await record_runs(secure_nats, database_url, tmp_path, runs, partial(staged, store=store),
                      "staged")  # fmt: skip
    assert len(list((store / "out").iterdir())) == len(runs) * STAGED
    check_predictions(tmp_path, "staging workload, 1 x 2 x 2", STAGED, MORE_PILOTS)
