"""The projector against real nats-server and Postgres: fold, idempotence, quarantine, rebuild."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import psycopg
import pytest
from nats.js import JetStreamContext

from lodestream.eventlog import EventLog
from lodestream.infra.postgres.tables import READ_SCHEMA
from lodestream.schemas.envelope import Event
from lodestream.schemas.events import JobReady, JobStarted
from lodestream.schemas.events.job import StartedData
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.services.projector.consumer import Projector
from lodestream.services.projector.messages import RawMessage
from lodestream.services.projector.rebuild import Rebuild
from lodestream.services.projector.rows import PROGRESS_COLUMNS
from lodestream.services.projector.store import BY_KEY_MAX, ProjectionStore, Rows
from tests.support.builders import (
    job_created,
    lifecycle,
    lifecycle_finished_by_pilot,
    site_registered,
)
from tests.support.projection import (
    running_projector,
    table_digest,
    wait_for_position,
)

OWNER = "ada"
SITE = "alpha"


async def append_all(log: EventLog, events: list[Event]) -> int:
    """Append in order with CAS chained per aggregate; return the last stream sequence."""
    last: dict[uuid.UUID, int] = {}
    seq = 0
    for event in events:
        appended = await log.append(event, expect=last.get(event.aggregate_id, 0))
        last[event.aggregate_id] = seq = appended.seq
    return seq


async def workload(log: EventLog, jobs: int) -> int:
    events: list[Event] = [site_registered(SITE, OWNER)]
    for _ in range(jobs):
        created = job_created(SITE, OWNER, tags={"kind": "eigh"})
        events += [created, *lifecycle(created)]
    return await append_all(log, events)


async def fetch(dsn: str, query: str, *params: object) -> list[tuple[object, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(query, params)
        return await cursor.fetchall()


async def test_jobs_are_projected_with_state_and_history(
    js: JetStreamContext, database_url: str
) -> None:
    log = EventLog(js)
    last = await workload(log, jobs=20)
    async with running_projector(js, database_url):
        await wait_for_position(database_url, last)

    rows = await fetch(database_url, "SELECT state, owner, attempts, return_code FROM rm.jobs")
    assert len(rows) == 20
    assert set(rows) == {("JOB_FINISHED", OWNER, 1, 0)}
    events = await fetch(
        database_url, "SELECT type, from_state, to_state FROM rm.job_events ORDER BY seq LIMIT 5"
    )
    assert events == [
        ("job.created", None, "CREATED"),
        ("job.preprocessed", "CREATED", "PREPROCESSED"),
        ("job.started", "PREPROCESSED", "RUNNING"),
        ("job.run_done", "RUNNING", "RUN_DONE"),
        ("job.finished", "RUN_DONE", "JOB_FINISHED"),
    ]
    assert await fetch(database_url, "SELECT count(*) FROM rm.quarantine") == [(0,)]


async def test_a_job_the_pilot_finished_is_projected_with_its_return_code(
    js: JetStreamContext, database_url: str
) -> None:
    log = EventLog(js)
    created = job_created(SITE, OWNER)
    last = await append_all(
        log, [site_registered(SITE, OWNER), created, *lifecycle_finished_by_pilot(created)]
    )
    async with running_projector(js, database_url):
        await wait_for_position(database_url, last)

    rows = await fetch(database_url, "SELECT state, attempts, return_code FROM rm.jobs")
    assert rows == [("JOB_FINISHED", 1, 0)]
    events = await fetch(
        database_url, "SELECT type, from_state, to_state FROM rm.job_events ORDER BY seq"
    )
    assert events[-1] == ("job.finished", "RUNNING", "JOB_FINISHED")
    assert await fetch(database_url, "SELECT count(*) FROM rm.quarantine") == [(0,)]


async def test_redelivered_batch_is_a_no_op(js: JetStreamContext, database_url: str) -> None:
    log = EventLog(js)
    last = await workload(log, jobs=5)
    async with running_projector(js, database_url) as projector:
        await wait_for_position(database_url, last)
        before = await table_digest(database_url)
        # Replay the whole stream through the same projector, as a redelivery would.
        raws = [
            RawMessage(EVENTS_STREAM, seq, m.subject or "", m.data or b"", dict(m.headers or {}))
            for seq in range(1, last + 1)
            for m in [await js.get_msg(EVENTS_STREAM, seq)]
        ]
        assert await projector.apply(raws)
    assert await table_digest(database_url) == before


async def many_jobs(database_url: str, count: int) -> list[uuid.UUID]:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO rm.sites (name, id, owner, created_at, last_seq) "
            "VALUES ('s', gen_random_uuid(), 'o', now(), 1)"
        )
        await conn.execute(
            "INSERT INTO rm.jobs (id, site, owner, app, state, workdir, parameters, tags, data, "
            "resources, transfers, parent_ids, attempts, created_seq, last_seq, created_at, "
            "updated_at, stage_times) SELECT gen_random_uuid(), 's', 'o', 'a', 'CREATED', 'w', "
            "'{}', '{}', '{}', '{}', '{}', '{}', 0, g, g, now(), now(), '{}' "
            "FROM generate_series(1, %s) g",
            (count,),
        )
        await conn.execute("ANALYZE rm.jobs")
        cursor = await conn.execute("SELECT id FROM rm.jobs ORDER BY created_seq")
        return [r[0] for r in await cursor.fetchall()]


def progress_of(ids: list[uuid.UUID]) -> list[tuple[object, ...]]:
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    return [
        (job, "RUNNING", n, uuid.uuid4() if n % 2 else None, n % 5, None if n % 3 else -n,
         None if n % 2 else f"tab\tnewline\n\\N é {n}", n + 7, at,
         '{"RUNNING": "2026-01-02T03:04:05+00:00"}')
        for n, job in enumerate(ids)
    ]  # fmt: skip


async def test_a_batch_finds_the_jobs_it_moves_on_by_key(database_url: str) -> None:
    """Not by hashing every job, a cost that would grow with the table: a live batch's
    progress rows are estimated at a few and each job is looked up by its key."""
    ids = await many_jobs(database_url, 50_000)
    columns = [list(c) for c in zip(*progress_of(ids[:30]), strict=True)]
    explain = psycopg.sql.SQL("EXPLAIN ") + ProjectionStore(READ_SCHEMA).progress_update
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        plan = "\n".join(str(r[0]) for r in await (await conn.execute(explain, columns)).fetchall())
    assert "Index Scan using jobs_pkey" in plan, plan
    assert "Hash" not in plan, plan
    assert "Merge" not in plan, plan


async def test_few_and_many_jobs_moved_on_store_the_same_columns(database_url: str) -> None:
    """A batch of a few jobs is written by key, one of many by a join: the same values."""
    ids = await many_jobs(database_url, 1_000)
    few, many = progress_of(ids[:BY_KEY_MAX]), progress_of(ids[BY_KEY_MAX:])
    assert len(many) > BY_KEY_MAX
    store = ProjectionStore(READ_SCHEMA)
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        for progress in (few, many):
            rows = Rows(
                new_jobs=[], progress=progress, job_events=[], ops=[], quarantine=[],
                last_seq={}, has_jobs=False, has_progress=True, has_job_events=False,
            )  # fmt: skip
            async with conn.transaction():
                await store.write_jobs(conn, rows)
        columns = ", ".join(PROGRESS_COLUMNS)
        cursor = await conn.execute(f"SELECT {columns} FROM rm.jobs ORDER BY created_seq")
        stored = await cursor.fetchall()
    expected = [(*row[:-1], {"RUNNING": "2026-01-02T03:04:05+00:00"}) for row in few + many]
    assert stored == expected


async def test_a_projector_folds_onto_what_another_writer_committed_not_its_cache(
    js: JetStreamContext, database_url: str
) -> None:
    log = EventLog(js)
    created = job_created(SITE, OWNER)
    events = [site_registered(SITE, OWNER), created, *lifecycle(created)]
    last = await append_all(log, events)
    raws = [
        RawMessage(EVENTS_STREAM, seq, m.subject or "", m.data or b"")
        for seq in range(1, last + 1)
        for m in [await js.get_msg(EVENTS_STREAM, seq)]
    ]
    first, other = (
        Projector(js, database_url, stream=EVENTS_STREAM, durable=name, batch_size=10,
                  fetch_timeout_s=0.2, store=ProjectionStore(READ_SCHEMA))
        for name in ("first", "other")
    )  # fmt: skip
    try:
        # ``first`` keeps what it folded; ``other`` moves the job on behind its back.
        assert await first.apply(raws[:3])
        assert await other.apply(raws[3:4])
        assert await first.apply(raws[4:])
    finally:
        await first.close()
        await other.close()
    assert await fetch(database_url, "SELECT count(*) FROM rm.quarantine") == [(0,)]
    assert await fetch(database_url, "SELECT state FROM rm.jobs") == [("JOB_FINISHED",)]


async def test_bad_events_are_quarantined_and_the_projector_carries_on(
    js: JetStreamContext, database_url: str
) -> None:
    log = EventLog(js)
    await workload(log, jobs=1)
    created = job_created(SITE, OWNER)
    await log.append(created, expect=0)
    job = created.aggregate_id
    # 1. not JSON at all; 2. unknown type; 3. illegal transition (started without being runnable);
    # 4. a site writing about another site's job; 5. payload site differs from the subject.
    await js.publish(f"evt.{SITE}.job.{job}.started", b"{not json")
    await js.publish(f"evt.{SITE}.job.{job}.exploded", b'{"type": "job.exploded", "v": 1}')
    illegal = JobStarted.create(
        site=SITE, aggregate_id=job, actor="launcher:x",
        data=StartedData(session_id=uuid.uuid4()),
    )  # fmt: skip
    await log.append(illegal, expect=None)
    forged = JobReady.create(site="beta", aggregate_id=job, actor="controller:x")
    await js.publish(forged.subject, forged.model_dump_json().encode())
    await js.publish(f"evt.{SITE}.job.{job}.ready", forged.model_dump_json().encode())
    # ...and a valid event after all of that is still projected.
    ready = JobReady.create(site=SITE, aggregate_id=job, actor="controller:main")
    last = (await log.append(ready, expect=None)).seq

    async with running_projector(js, database_url):
        await wait_for_position(database_url, last)

    reasons = [
        str(r[0])
        for r in await fetch(database_url, "SELECT reason FROM rm.quarantine ORDER BY seq")
    ]
    assert len(reasons) == 5
    assert "not JSON" in reasons[0]
    assert "unknown event type 'job.exploded'" in reasons[1]
    assert "illegal: job.started is not allowed from CREATED" in reasons[2]
    assert "at 'beta' does not match job" in reasons[3]
    assert "site 'beta' on a subject of site 'alpha'" in reasons[4]
    assert await fetch(database_url, "SELECT state FROM rm.jobs WHERE id = %s", job) == [("READY",)]


async def test_job_for_unregistered_site_is_quarantined(
    js: JetStreamContext, database_url: str
) -> None:
    log = EventLog(js)
    last = (await log.append(job_created("nowhere", OWNER), expect=0)).seq
    async with running_projector(js, database_url):
        await wait_for_position(database_url, last)
    assert await fetch(database_url, "SELECT count(*) FROM rm.jobs") == [(0,)]
    [(reason,)] = await fetch(database_url, "SELECT reason FROM rm.quarantine")
    assert "unregistered site 'nowhere'" in str(reason)


async def test_rebuild_swaps_in_under_a_running_projector(
    js: JetStreamContext, database_url: str
) -> None:
    log = EventLog(js)
    last = await workload(log, jobs=30)
    await js.publish(f"evt.{SITE}.job.{uuid.uuid4()}.ready", b"garbage")  # quarantined
    last += 1
    indexes = "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'rm' ORDER BY 1"
    migrated = await fetch(database_url, indexes)
    async with running_projector(js, database_url):
        await wait_for_position(database_url, last)
        live = await table_digest(database_url)
        report = await Rebuild(js, database_url, batch_size=40).run()
        assert report.positions[EVENTS_STREAM] == last
        assert report.quarantined == 1
        assert await table_digest(database_url) == live
        # The indexes the rebuild built after its bulk load are the migrations' own.
        assert await fetch(database_url, indexes) == migrated
        # The live projector carries on against the swapped-in tables.
        more = await workload_more(log)
        await wait_for_position(database_url, more)
    assert (await table_digest(database_url))["jobs"][0] == 31


async def workload_more(log: EventLog) -> int:
    created = job_created(SITE, OWNER)
    return (await log.append(created, expect=0)).seq


@pytest.mark.parametrize("batch_size", [1, 7, 5000])
async def test_rebuild_equals_live_fold(
    js: JetStreamContext, database_url: str, batch_size: int
) -> None:
    log = EventLog(js)
    last = await workload(log, jobs=25)
    async with running_projector(js, database_url):
        await wait_for_position(database_url, last)
    live = await table_digest(database_url)
    report = await Rebuild(js, database_url, batch_size=batch_size).run()
    assert report.events == last
    assert await table_digest(database_url) == live


async def test_a_message_postgres_refuses_is_quarantined_and_the_rest_projected(
    js: JetStreamContext, database_url: str
) -> None:
    """If a value the schemas accept is refused by Postgres (here: a CHECK constraint stands
    in for any such gap), the projector finds that one message, quarantines it with
    Postgres' reason, and folds the rest of the batch: it never crash-loops on it."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute("ALTER TABLE rm.jobs ADD CONSTRAINT refuse_evil CHECK (app <> 'evil')")
    log = EventLog(js)
    jobs = [job_created(SITE, OWNER, app=app) for app in ("good", "evil", "fine")]
    last = await append_all(log, [site_registered(SITE, OWNER), *jobs])
    async with running_projector(js, database_url) as projector:
        await wait_for_position(database_url, last)
        assert projector.unstorable == 1
    rows = await fetch(database_url, "SELECT app FROM rm.jobs ORDER BY app")
    assert rows == [("fine",), ("good",)]
    reasons = await fetch(database_url, "SELECT subject, reason FROM rm.quarantine")
    assert len(reasons) == 1
    assert str(reasons[0][0]) == jobs[1].subject
    assert "unstorable" in str(reasons[0][1])
    assert "refuse_evil" in str(reasons[0][1])
