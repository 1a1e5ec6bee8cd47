"""A refused path belongs to its own job (issue 31, items 7 and 8), from outside: the HTTP api,
projector, controller, a site agent and a pilot on the real servers, staging through the local
backend and through rsync over ssh to a real sshd on loopback.

21 jobs are submitted in one request through the api; one names a source (or a destination)
the backend finds it cannot use, and one more job, forged straight onto the log past the api,
names a relative path. The other 20 finish; each of the two fails with its own reason. What is
checked is the log itself, not the read model. A path no backend can move is refused by the
api with 422, naming the job and the slot.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final

import psycopg
import pytest
from nats.js import JetStreamContext

from lodestream.agents.launcher.main import run as run_launcher
from lodestream.agents.site.main import run as run_site_agent
from lodestream.agents.site.settings import SiteSettings
from lodestream.eventlog import EventLog, ensure_streams, jetstream
from lodestream.natsconn import connect
from lodestream.schemas.envelope import Event
from lodestream.schemas.events import JobCreated
from lodestream.schemas.resources import App, AppTransferSlot, JobSpec
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.schemas.trust import event_from_message
from lodestream.services.api.main import create_app
from tests.fixtures.api import ApiHarness, api_client, api_settings, running_projector
from tests.fixtures.nats import SecureNats
from tests.fixtures.sshd import SshServer, require_rsync
from tests.integration.test_controller import running_controller
from tests.support.processes import TEST_HEARTBEAT_TTL_S
from tests.support.site import secure_site_dir
from tests.support.staging import declare_locations

USER, SITE = "ada", "alpha"
JOBS: Final = 21
BAD: Final = 7  # the index of the job whose path the backend cannot use
FINAL_STATES: Final = ("JOB_FINISHED", "FAILED")


@pytest.fixture
def remote(tmp_path: Path) -> Path:
    """The beamline's storage, as in test_staging: an input, calibration files, results."""
    root = tmp_path / "beamline"
    (root / "calib").mkdir(parents=True)
    (root / "raw.txt").write_text("raw-frame\n")
    (root / "calib" / "a.txt").write_text("calib-a\n")
    (root / "results").mkdir()
    (root / "results" / "blocked").write_text("a file where a directory should be\n")
    return root


@pytest.fixture(params=["local", "rsync-ssh"])
def site(
    request: pytest.FixtureRequest, secure_nats: SecureNats, tmp_path: Path, remote: Path
) -> SiteSettings:
    # A long poll interval: the items of many jobs wait in one pool and go in one task.
    transfers: dict[str, Any] = {
        "poll_interval_s": 0.5, "batch_size": 8, "max_concurrent": 4, "retry_budget": 1,
    }  # fmt: skip
    if request.param == "local":
        transfers["locations"] = {"beamline": f"local:{remote}"}
    else:
        require_rsync()
        server: SshServer = request.getfixturevalue("sshd_server")
        url = f"rsync://{server.user}@{server.host}:{server.port}{remote}"
        transfers |= {"locations": {"beamline": url}, "ssh_identity": str(server.identity_file),
                      "ssh_options": list(server.ssh_options)}  # fmt: skip
    return secure_site_dir(secure_nats, tmp_path / "sites", transfers=transfers)


def spec(workdir: str, *, raw: str = "/raw.txt", result: str | None = None) -> dict[str, Any]:
    return {
        "site": SITE, "app": "reduce", "workdir": workdir,
        "transfers": {
            "raw": {"location": "beamline", "path": raw},
            "calib": {"location": "beamline", "path": "/calib", "recursive": True},
            "result": {"location": "beamline", "path": result or f"/results/{workdir}.txt"},
        },
    }  # fmt: skip


def forged(workdir: str, **paths: str) -> JobCreated:
    """A job appended straight to the log, past the api's checks."""
    return JobCreated.create(
        site=SITE, aggregate_id=uuid.uuid4(), actor=f"user:{USER}",
        data=JobSpec.model_validate(spec(workdir, **paths)),
    )  # fmt: skip


@asynccontextmanager
async def stack(secure_nats: SecureNats, dsn: str, site: SiteSettings) -> AsyncIterator[ApiHarness]:
    """The api and the control plane, with the site's agent and a pilot running."""
    nc = await connect(secure_nats.settings())
    js = jetstream(nc)
    await ensure_streams(js, heartbeat_ttl_s=TEST_HEARTBEAT_TTL_S)
    settings = api_settings(secure_nats, dsn)
    app = create_app(settings)
    try:
        async with (
            running_projector(js, dsn) as projector,
            running_controller(js, dsn),
            api_client(app) as client,
        ):
            api = ApiHarness(client, app, settings, js, secure_nats, projector)
            await api.register_site(USER, SITE)
            stop = asyncio.Event()
            tasks = [
                asyncio.create_task(run_site_agent(site.directory, stop=stop)),
                asyncio.create_task(run_launcher(site.directory, wall_time_min=10, stop=stop)),
            ]
            try:
                await site_ready(dsn)
                yield api
            finally:
                stop.set()
                await asyncio.gather(*tasks)
    finally:
        await nc.close()


async def site_ready(dsn: str) -> None:
    """Until the read model knows the site's app ``reduce`` and its transfer locations."""
    async with asyncio.timeout(60), await psycopg.AsyncConnection.connect(dsn) as conn:
        while True:
            cursor = await conn.execute(
                "SELECT 1 FROM rm.apps a JOIN rm.sites s ON s.name = a.site WHERE a.site = %s "
                "AND a.name = 'reduce' AND s.transfer_locations <> '{}'::jsonb",
                (SITE,),
            )
            if await cursor.fetchone():
                return
            await asyncio.sleep(0.05)


async def until_settled(dsn: str, ids: list[uuid.UUID], timeout_s: float = 300) -> None:
    counts: dict[str, int] = {}
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        try:
            async with asyncio.timeout(timeout_s):
                while sum(counts.get(state, 0) for state in FINAL_STATES) < len(ids):
                    await asyncio.sleep(0.1)
                    cursor = await conn.execute(
                        "SELECT state, count(*) FROM rm.jobs WHERE id = ANY(%s) GROUP BY 1",
                        (ids,),
                    )
                    counts = {str(state): int(n) for state, n in await cursor.fetchall()}
        except TimeoutError:
            pytest.fail(f"jobs not settled after {timeout_s} s: {counts}")


async def log_events(js: JetStreamContext) -> list[Event]:
    """Every event of the site on the log, in log order."""
    if (await js.stream_info(EVENTS_STREAM)).state.last_seq == 0:
        return []
    sub = await js.subscribe(f"evt.{SITE}.>", ordered_consumer=True)
    events: list[Event] = []
    try:
        while True:
            msg = await sub.next_msg(timeout=5)
            events.append(event_from_message(msg.subject, msg.data))
            if msg.metadata.num_pending == 0:
                return events
    finally:
        await sub.unsubscribe()


async def submit_batch(api: ApiHarness, bad: dict[str, Any], fake: JobCreated) -> list[uuid.UUID]:
    """21 jobs through the api, ``bad`` among them at ``BAD``, then ``fake`` onto the log."""
    jobs = [spec(f"r{n}") for n in range(JOBS)]
    jobs[BAD] = bad
    response = await api.submit(USER, jobs)
    assert response.status_code == 201, response.text
    ids = [uuid.UUID(job["id"]) for job in response.json()["jobs"]]
    await EventLog(api.js).append(fake, expect=0)
    return [*ids, fake.aggregate_id]


def outcomes(events: list[Event], ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
    """Each job's end on the log: 'finished', or the reason of its ``job.failed``."""
    ends: dict[uuid.UUID, str] = {}
    for event in events:
        if event.aggregate_id in ids and event.type == "job.finished":
            ends[event.aggregate_id] = "finished"
        elif event.aggregate_id in ids and event.type == "job.failed":
            ends[event.aggregate_id] = str(event.data.reason)  # type: ignore[attr-defined]
    return ends


def batched(events: list[Event], direction: str) -> int:
    """The most items of one direction that one task moved."""
    direction_of = {e.aggregate_id: e.data.direction for e in events if e.type == "xfer.requested"}  # type: ignore[attr-defined]
    sizes = [
        e.data.items_in_task  # type: ignore[attr-defined]
        for e in events
        if e.type == "xfer.submitted" and direction_of.get(e.aggregate_id) == direction
    ]
    return max(sizes, default=0)


async def test_one_refused_stage_in_fails_its_own_job_and_the_twenty_others_finish(
    secure_nats: SecureNats, database_url: str, site: SiteSettings
) -> None:
    async with stack(secure_nats, database_url, site) as api:
        ids = await submit_batch(
            api, spec(f"r{BAD}", raw="/not-there.txt"), forged("forged", raw="p/typo.txt")
        )
        await until_settled(database_url, ids)
        events = await log_events(api.js)
    ends = outcomes(events, ids)
    bad, fake = ids[BAD], ids[-1]
    assert {job for job, end in ends.items() if end == "finished"} == set(ids) - {bad, fake}
    assert ends[bad].startswith("stage-in of slot 'raw' failed: ")
    assert "No such file or directory" in ends[bad]
    assert ends[fake].startswith("stage-in of slot 'raw' failed: ")
    assert "the remote path 'p/typo.txt' is not an absolute path" in ends[fake]
    failed_items = [e for e in events if e.type == "xfer.failed"]
    assert len(failed_items) == 2
    assert batched(events, "in") > 2  # the jobs' inputs did travel together
    assert (site.data_dir / "r0" / "in" / "raw.txt").read_text() == "raw-frame\n"


async def test_one_refused_stage_out_fails_its_own_job_and_the_twenty_others_finish(
    secure_nats: SecureNats, database_url: str, site: SiteSettings, remote: Path
) -> None:
    async with stack(secure_nats, database_url, site) as api:
        ids = await submit_batch(
            api,
            spec(f"r{BAD}", result="/results/blocked/out.txt"),  # 'blocked' is a file
            forged("forged", result="results/typo.txt"),
        )
        await until_settled(database_url, ids)
        events = await log_events(api.js)
    ends = outcomes(events, ids)
    bad, fake = ids[BAD], ids[-1]
    assert {job for job, end in ends.items() if end == "finished"} == set(ids) - {bad, fake}
    assert ends[bad].startswith("stage-out of slot 'result' failed: ")
    assert "typo" not in ends[bad]
    assert ends[fake].startswith("stage-out of slot 'result' failed: ")
    assert "the remote path 'results/typo.txt' is not an absolute path" in ends[fake]
    # Both ran before their stage-out failed.
    started = {e.aggregate_id for e in events if e.type == "job.started"}
    assert {bad, fake} <= started
    for n in set(range(JOBS)) - {BAD}:
        assert (remote / "results" / f"r{n}.txt").read_text() == "raw-frame\ncalib-a\n"


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("p/typo.txt", "'p/typo.txt' is not an absolute path"),
        ("/data/../../etc/passwd", "climbs out of its location's base"),
        ("/in\nput.h5", "control character"),
    ],
)
async def test_the_api_refuses_a_path_no_backend_can_move_naming_the_job_and_slot(
    api: ApiHarness, path: str, words: str
) -> None:
    await api.register_site(USER, SITE)
    await api.wait_projected(await declare_locations(api.js, SITE, {"archive": "local:/data"}))
    slots = {"input": AppTransferSlot(direction="in", local_path="in.h5")}
    await api.register_app(App(site=SITE, name="sim", transfers=slots))
    good = {"location": "archive", "path": "/data/in.h5"}
    jobs = [
        {"site": SITE, "app": "sim", "workdir": f"w{n}", "transfers": {"input": good}}
        for n in range(3)
    ]
    jobs[1]["transfers"] = {"input": {"location": "archive", "path": path}}
    before = await api.message_count()
    response = await api.submit(USER, jobs)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["message"].startswith("invalid submission: body.jobs.1.transfers.input.path: ")
    [detail] = error["details"]
    assert detail["loc"] == ["body", "jobs", 1, "transfers", "input", "path"]
    assert detail["msg"].startswith("transfer slot 'input': ")
    assert words in detail["msg"]
    assert await api.message_count() == before  # nothing appended, not even the good jobs
