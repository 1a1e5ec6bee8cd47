"""A rebuild split across processes by job gives exactly the tables one process gives.

Against real nats-server and Postgres, with spawned processes: a log of two sites, one
registered only part way through (the jobs it was sent before that are refused, in every
process), sessions, batch jobs, an app, illegal transitions, forged and garbled messages on
job subjects and on subjects that name no job. The live projector's fold, a rebuild in one
process and rebuilds in two and three processes must leave the same rows, the same
quarantine with the same reasons, and report the same counts.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from nats.js import JetStreamContext

from lodestream.infra.postgres.tables import REBUILD_SCHEMA
from lodestream.schemas.codec import encode
from lodestream.schemas.envelope import Event
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.services.projector import rebuild as rebuild_module
from lodestream.services.projector.errors import RebuildError
from lodestream.services.projector.rebuild import Rebuild
from lodestream.services.projector.split import deal
from tests.support.analytics import OWNER, varied_log
from tests.support.builders import job_created, lifecycle, site_registered
from tests.support.projection import running_projector, table_digest, wait_for_position


async def publish(js: JetStreamContext, subject: str, data: bytes) -> int:
    ack = await js.publish(subject, data, headers={"Nats-Msg-Id": str(uuid.uuid4())})
    return ack.seq


async def publish_event(js: JetStreamContext, event: Event) -> int:
    return await publish(js, event.subject, encode(event))


async def mixed_log(js: JetStreamContext) -> int:
    """The log described above; return its last sequence."""
    await publish_event(js, site_registered("alpha", OWNER))
    varied = varied_log()
    for raw in varied[:30]:  # beta's first jobs, before beta is registered: refused
        await publish(js, raw.subject, raw.data)
    await publish_event(js, site_registered("beta", OWNER))
    for raw in varied[30:]:
        await publish(js, raw.subject, raw.data)
    for _ in range(40):
        created = job_created("alpha", OWNER, tags={"run": "split"})
        for event in (created, *lifecycle(created)):
            await publish_event(js, event)
    # Subjects the split must not take for a job's: too many tokens, a site named "job".
    await publish(js, f"evt.alpha.job.{uuid.uuid4()}.finished.twice", b"{}")
    await publish(js, f"evt.job.site.{uuid.uuid4()}.registered", b"{}")
    return await publish(js, f"evt.alpha.job.{uuid.uuid4()}.ready", b"garbage")


def report_counts(report: Any) -> tuple[int, int, int, dict[str, int]]:
    return report.events, report.jobs, report.quarantined, report.positions


async def test_a_rebuild_in_several_processes_equals_one_in_one(
    js: JetStreamContext, database_url: str
) -> None:
    last = await mixed_log(js)
    async with running_projector(js, database_url):
        await wait_for_position(database_url, last)
    live = await table_digest(database_url)
    assert live["quarantine"][0] > 100  # refusals of every kind made it into the log

    one = await Rebuild(js, database_url, batch_size=64, workers=1).run()
    assert await table_digest(database_url) == live
    for workers in (2, 3):
        split = await Rebuild(js, database_url, batch_size=64, workers=workers).run()
        assert await table_digest(database_url) == live, workers
        assert report_counts(split) == report_counts(one), workers
    assert one.positions[EVENTS_STREAM] == last
    assert multiprocessing.active_children() == []


def test_every_event_of_a_job_goes_to_one_share_and_site_events_to_all() -> None:
    job, other = uuid.uuid4(), uuid.uuid4()
    wires = [
        (b"evt.alpha.site.x.registered", b"r1", b"", None),
        (f"evt.alpha.job.{job}.created".encode(), b"r2", b"", None),
        (f"evt.alpha.job.{other}.created".encode(), b"r3", b"", None),
        (f"evt.alpha.batch.{job}.requested".encode(), b"r4", b"", None),
        (f"evt.alpha.job.{job}.started".encode(), b"r5", b"", None),
        (f"evt.alpha.job.{job}.started.x".encode(), b"r6", b"", None),
        (b"evt.alpha.job.not-a-uuid.created", b"r7", b"", None),
    ]
    kept, dealt = deal(wires, 3)
    assert [w[1] for w in kept] == [b"r1", b"r4", b"r6"]
    for part in dealt:
        assert part[0][1] == b"r1"  # every share knows the site, first
    holding_job = [part for part in dealt if any(w[1] == b"r2" for w in part)]
    assert len(holding_job) == 1
    assert [w[1] for w in holding_job[0] if w[1] in (b"r2", b"r5")] == [b"r2", b"r5"]
    assert sum(len(part) for part in dealt) == 3 + 4  # the site event thrice, the jobs once


async def test_a_process_that_fails_fails_the_rebuild_and_leaves_the_live_tables(
    js: JetStreamContext, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    last = await mixed_log(js)
    async with running_projector(js, database_url):
        await wait_for_position(database_url, last)
    live = await table_digest(database_url)

    create: Callable[[str], None] = rebuild_module.create_rebuild_schema

    def create_then_refuse_history(dsn: str) -> None:
        # Only the processes that fold jobs write their history: the failure is theirs.
        create(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                f"CREATE FUNCTION {REBUILD_SCHEMA}.refuse() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'history refused'; END $$"
            )
            conn.execute(
                f"CREATE TRIGGER refuse BEFORE INSERT ON {REBUILD_SCHEMA}.job_events "
                f"FOR EACH ROW EXECUTE FUNCTION {REBUILD_SCHEMA}.refuse()"
            )

    monkeypatch.setattr(rebuild_module, "create_rebuild_schema", create_then_refuse_history)
    with pytest.raises(RebuildError, match=r"rebuild process \d of 2 failed: .*history refused"):
        await Rebuild(js, database_url, batch_size=64, workers=2).run()
    assert multiprocessing.active_children() == []
    assert await table_digest(database_url) == live


@pytest.mark.parametrize("workers", [1, 2])
async def test_what_arrives_during_the_bulk_replay_is_caught_up_onto_the_rebuilt_rows(
    js: JetStreamContext, database_url: str, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """Events appended after the bulk replay took its end (while the indexes are built):
    the catch-up folds them onto the rows the bulk replay wrote, read back from the rebuilt
    tables, and the tables equal those of a rebuild that folds them all in its bulk replay."""
    await mixed_log(js)
    created = [job_created("alpha", OWNER, tags={"run": "late"}) for _ in range(30)]
    for job in created:
        for event in (job, *lifecycle(job)[:2]):  # created, preprocessed, started
            await publish_event(js, event)
    steps = [step for job in created for step in lifecycle(job)[2:]]  # run_done, finished
    loop = asyncio.get_running_loop()
    index = rebuild_module.index_rebuild_schema
    appended: list[int] = []

    async def append_steps() -> int:
        for step in steps:
            await publish_event(js, step)
        return await publish(js, f"evt.alpha.job.{uuid.uuid4()}.ready", b"late garbage")

    def append_then_index(dsn: str) -> None:
        # In the rebuild's thread, its loop free meanwhile: they land after the bulk's end.
        appended.append(asyncio.run_coroutine_threadsafe(append_steps(), loop).result())
        index(dsn)

    monkeypatch.setattr(rebuild_module, "index_rebuild_schema", append_then_index)
    caught_up = await Rebuild(js, database_url, batch_size=64, workers=workers).run()
    assert caught_up.positions[EVENTS_STREAM] == appended[0]
    rebuilt = await table_digest(database_url)
    monkeypatch.undo()
    whole = await Rebuild(js, database_url, batch_size=64, workers=1).run()
    assert await table_digest(database_url) == rebuilt
    assert report_counts(caught_up) == report_counts(whole)
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cursor = await conn.execute('SELECT state FROM rm.jobs WHERE tags @> \'{"run": "late"}\'')
        assert await cursor.fetchall() == [("JOB_FINISHED",)] * 30
