"""Jobs created runnable, end to end (issue 15, lever 1): api, projector, controller, a site
agent and a pilot over wss, on the real servers.

A job with nothing to do before or after its run costs three events on the log —
``job.created`` (runnable), ``job.started`` (the lease), ``job.finished`` (carrying the run's
result) — and neither the controller nor the site agent appends anything for it. A job whose
app has a ``preprocess`` hook still goes through the site agent, and a DAG child still goes
through the controller. A runnable creation the fold refuses is quarantined and run by
nobody, and rebuilding the read model from the log gives the same tables.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import psycopg
from nats.js import JetStreamContext

from lodestream.agents.launcher.main import run as run_launcher
from lodestream.agents.site.main import run as run_site_agent
from lodestream.eventlog import EventLog, ensure_streams, jetstream
from lodestream.natsconn import connect
from lodestream.schemas.events.job import CreatedData, JobCreated
from lodestream.schemas.states import CREATED_RUNNABLE
from lodestream.schemas.subjects import EVENTS_STREAM, aggregate_filter
from lodestream.services.api.main import create_app
from lodestream.services.projector.rebuild import Rebuild
from tests.fixtures.api import ApiHarness, api_client, api_settings, running_projector
from tests.fixtures.nats import SecureNats
from tests.integration.test_controller import running_controller
from tests.integration.test_launcher import until_all
from tests.support.processes import TEST_HEARTBEAT_TTL_S
from tests.support.projection import table_digest, wait_for_position
from tests.support.site import secure_site_dir

USER, SITE = "ada", "alpha"
PREPPED = '''
from lodestream.agents.site.apps import ApplicationDefinition


class Prepped(ApplicationDefinition):
    """Has a preprocess hook: its jobs go through the site agent before they run."""

    name = "prepped"
    command_template = "true"

    def preprocess(self) -> None:
        pass
'''

Step = tuple[str, str, Any]  # type, actor kind, data.skipped


async def steps(dsn: str, job_id: uuid.UUID) -> list[Step]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT type, split_part(actor, ':', 1), data->'skipped' FROM rm.job_events "
            "WHERE job_id = %s ORDER BY seq",
            (job_id,),
        )
        return [(str(t), str(a), s) for t, a, s in await cursor.fetchall()]


async def events_on_log(js: JetStreamContext, job_id: uuid.UUID) -> int:
    """How many events the stream holds for ``job_id``, whatever the read model made of them."""
    info = await js.stream_info(
        EVENTS_STREAM, subjects_filter=aggregate_filter(SITE, "job", job_id)
    )
    return sum((info.state.subjects or {}).values())


async def events_digest(dsn: str) -> dict[str, tuple[int, str]]:
    """The read models as :func:`table_digest` has them, less ``sessions``: that one folds
    heartbeats too, of which the HB stream keeps only each session's newest for a rebuild."""
    return {name: rows for name, rows in (await table_digest(dsn)).items() if name != "sessions"}


async def until_hooks(dsn: str, app: str, timeout_s: float = 30) -> list[str]:
    """The hooks of ``app`` once the site agent's registration of it is in the read model."""
    async with asyncio.timeout(timeout_s), await psycopg.AsyncConnection.connect(dsn) as conn:
        while True:
            cursor = await conn.execute(
                "SELECT hooks FROM rm.apps WHERE site = %s AND name = %s", (SITE, app)
            )
            row = await cursor.fetchone()
            if row is not None:
                return list(row[0])
            await asyncio.sleep(0.05)


async def test_a_no_op_job_costs_three_events_and_the_other_paths_are_unchanged(
    secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    nc = await connect(secure_nats.settings())
    js = jetstream(nc)
    await ensure_streams(js, heartbeat_ttl_s=TEST_HEARTBEAT_TTL_S)
    settings = api_settings(secure_nats, database_url)
    app = create_app(settings)
    try:
        async with (
            running_projector(js, database_url) as projector,
            running_controller(js, database_url),
            api_client(app) as client,
        ):
            api = ApiHarness(client, app, settings, js, secure_nats, projector)
            await api.register_site(USER, SITE)
            site = secure_site_dir(secure_nats, tmp_path, site=SITE)
            (site.directory / "apps" / "prepped.py").write_text(PREPPED)
            stop_agent, stop_pilot = asyncio.Event(), asyncio.Event()
            agent = asyncio.create_task(run_site_agent(site.directory, stop=stop_agent))
            assert await until_hooks(database_url, "prepped") == ["preprocess"]
            await until_hooks(database_url, "hello")

            noop, parent, child, prepped = (uuid.uuid4() for _ in range(4))
            response = await api.submit(USER, [
                {"id": str(noop), "site": SITE, "app": "hello", "workdir": "noop"},
                {"id": str(parent), "site": SITE, "app": "hello", "workdir": "parent"},
                {"id": str(child), "site": SITE, "app": "hello", "workdir": "child",
                 "parent_ids": [str(parent)]},
                {"id": str(prepped), "site": SITE, "app": "prepped", "workdir": "prepped"},
            ])  # fmt: skip
            assert response.status_code == 201, response.text
            ids = [noop, parent, child, prepped]
            # The control plane's own key could append it; the projector, the controller and
            # the pilot all refuse it (a runnable creation of a job with parents).
            forged = illegal_creation(noop)
            await EventLog(js).append(forged, expect=0)
            pilot = asyncio.create_task(
                run_launcher(site.directory, wall_time_min=10, stop=stop_pilot)
            )
            await until_all(database_url, ids, "JOB_FINISHED")
            stop_pilot.set()
            report = await asyncio.wait_for(pilot, 30)
            stop_agent.set()
            await asyncio.wait_for(agent, 30)
            on_log = {job: await events_on_log(js, job) for job in ids}
            await wait_for_position(
                database_url, (await js.stream_info(EVENTS_STREAM)).state.last_seq
            )
        # The controller does not run during a rebuild: the control plane is down now.
        live = await events_digest(database_url)
        await Rebuild(js, database_url, batch_size=3).run()
        assert await events_digest(database_url) == live  # the log folds the same again
    finally:
        await nc.close()

    runnable = list(CREATED_RUNNABLE)
    three = [
        ("job.created", "user", runnable),
        ("job.started", "launcher", ["job.leased"]),
        ("job.finished", "launcher", ["job.run_done", "job.postprocessed", "job.staged_out"]),
    ]
    assert await steps(database_url, noop) == three
    assert await steps(database_url, parent) == three
    assert on_log[noop] == on_log[parent] == 3  # the log holds nothing the read model lacks

    # A DAG child is created CREATED; the controller releases it once its parent finished.
    child_steps = await steps(database_url, child)
    assert child_steps[0] == ("job.created", "user", [])
    assert child_steps[-3] == ("job.preprocessed", "controller", ["job.ready", "job.staged_in"])
    assert child_steps[-2:] == three[1:]
    assert [t for t, _, _ in child_steps[1:-3]] in ([], ["job.awaiting_parents"])

    # An app with a preprocess hook: the controller hands it to the site agent, which runs it.
    assert await steps(database_url, prepped) == [
        ("job.created", "user", []),
        ("job.staged_in", "controller", ["job.ready"]),
        ("job.preprocessed", "site", []),
        *three[1:],
    ]
    assert on_log[prepped] == 5
    assert report.finished == 4
    assert report.not_runnable == 2  # the child's and the prepped job's job.created, acked
    assert report.skipped == 1  # the forged creation: terminated, never leased
    assert await steps(database_url, forged.aggregate_id) == []
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cursor = await conn.execute("SELECT subject, reason FROM rm.quarantine")
        assert await cursor.fetchall() == [
            (forged.subject, "illegal: job.created skips to runnable a job that has parents")
        ]


def illegal_creation(parent: uuid.UUID) -> JobCreated:
    data = CreatedData(
        site=SITE, app="hello", workdir="forged", parent_ids=(parent,), skipped=CREATED_RUNNABLE
    )
    return JobCreated.create(site=SITE, aggregate_id=uuid.uuid4(), actor=f"user:{USER}", data=data)
