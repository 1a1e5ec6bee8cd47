"""The live projector's reading of EVENTS (RawPull, reading ahead) against nats-server and
Postgres: what it commits it acks, a consumer that does not follow the committed position is
repositioned, and a batch Postgres refuses for a while is retried while what was delivered
after it waits; every event is applied once, as a rebuild from sequence 1 applies it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
import pytest
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from lodestream.eventlog import Appended, EventLog
from lodestream.eventlog.errors import ReadError
from lodestream.schemas.envelope import Event
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.services.projector import consumer
from lodestream.services.projector.consumer import position_consumer
from lodestream.services.projector.messages import RawMessage
from lodestream.services.projector.reading import StreamReader, stream_reader
from lodestream.services.projector.rebuild import Rebuild
from lodestream.services.projector.store import ProjectionStore
from tests.support.builders import job_created, lifecycle, site_registered
from tests.support.projection import running_projector, table_digest, wait_for_position

SITE, OWNER = "alpha", "ada"
DURABLE = "projector"  # running_projector's
CONSUMER_LOG = "lodestream.services.projector.consumer"


async def append_jobs(js: JetStreamContext, jobs: int, *, site: bool = False) -> int:
    """``jobs`` jobs through their lifecycle (after the site, if asked); the last sequence."""
    events: list[Event] = [site_registered(SITE, OWNER)] if site else []
    for _ in range(jobs):
        created = job_created(SITE, OWNER)
        events += [created, *lifecycle(created)]
    results = await EventLog(js).append_many([(e, None) for e in events])
    assert all(isinstance(r, Appended) for r in results)
    return max(r.seq for r in results if isinstance(r, Appended))


async def logged(caplog: pytest.LogCaptureFixture, text: str) -> None:
    async with asyncio.timeout(30):
        while not any(text in r.getMessage() for r in caplog.records):
            await asyncio.sleep(0.02)


async def delivered(js: JetStreamContext) -> int:
    """The last stream sequence the projector's durable sent."""
    return int((await js.consumer_info(EVENTS_STREAM, DURABLE)).delivered.stream_seq)


async def has_delivered(js: JetStreamContext, seq: int) -> bool:
    try:
        return await delivered(js) >= seq
    except NotFoundError:  # the projector has not made its durable yet
        return False


async def applied_once(js: JetStreamContext, dsn: str, jobs: int) -> None:
    """Every job and event once, nothing quarantined, and the rows a fold from 1 makes."""
    live = await table_digest(dsn)
    assert (live["jobs"][0], live["job_events"][0], live["quarantine"][0]) == (jobs, jobs * 5, 0)
    await Rebuild(js, dsn).run()
    assert await table_digest(dsn) == live


async def test_what_the_projector_committed_it_acks(
    js: JetStreamContext, database_url: str
) -> None:
    last = await append_jobs(js, 300, site=True)
    async with running_projector(js, database_url):
        await wait_for_position(database_url, last)
        async with asyncio.timeout(30):
            while (await js.consumer_info(EVENTS_STREAM, DURABLE)).ack_floor.stream_seq < last:
                await asyncio.sleep(0.02)
    info = await js.consumer_info(EVENTS_STREAM, DURABLE)
    assert (info.ack_floor.stream_seq, info.num_ack_pending) == (last, 0)


async def test_a_consumer_that_skips_past_the_position_is_repositioned(
    js: JetStreamContext, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=CONSUMER_LOG)
    first = await append_jobs(js, 20, site=True)
    async with running_projector(js, database_url):
        await wait_for_position(database_url, first)
        # Behind the projector's back its durable is re-created to start six events on, as
        # one left with a batch unacked by a crash would go on with the next batch.
        await position_consumer(js, EVENTS_STREAM, DURABLE, 500, first + 6)
        last = await append_jobs(js, 20)
        await wait_for_position(database_url, last)
        await logged(caplog, f"batch does not follow position {first}; re-positioning")
    await applied_once(js, database_url, 40)


async def test_a_batch_postgres_refuses_is_retried_and_what_came_meanwhile_applied_once(
    js: JetStreamContext, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=CONSUMER_LOG)
    first = await append_jobs(js, 10, site=True)
    # Pull requests that outlive the appends: while its first batch is retried the projector
    # asks for nothing more, so with running_projector's 0.2 s requests, appends slower than
    # that (a loaded machine) left the 500 events this test waits for undelivered.
    async with running_projector(js, database_url, fetch_timeout_s=5.0):
        await wait_for_position(database_url, first)
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            await conn.execute("ALTER TABLE rm.job_events RENAME TO job_events_away")
            # Several batches' worth (running_projector's batch is 500 events).
            last = await append_jobs(js, 400)
            await logged(caplog, "tables replaced")
            # The pull request open when the batch failed is still filled: what comes for it
            # waits, delivered and unacked, behind the batch being retried.
            async with asyncio.timeout(30):
                while (await delivered(js)) < first + 500:
                    await asyncio.sleep(0.02)
            await conn.execute("ALTER TABLE rm.job_events_away RENAME TO job_events")
        await wait_for_position(database_url, last)
    await applied_once(js, database_url, 410)


EVIL = 550

# --- folding the next batch while one commits (services/projector/ahead.py) ---------------

FAIL_ONCE = """
CREATE SEQUENCE public.failed_once;
CREATE FUNCTION public.fail_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- nextval is not rolled back with the transaction it fails: this fires once.
    IF NEW.seq = {seq} AND nextval('public.failed_once') = 1 THEN
        RAISE EXCEPTION 'injected failure at seq %', NEW.seq USING ERRCODE = '40001';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER fail_once BEFORE INSERT ON rm.job_events
    FOR EACH ROW EXECUTE FUNCTION public.fail_once();
"""


async def test_batches_are_folded_ahead_while_the_one_before_commits(
    js: JetStreamContext, database_url: str
) -> None:
    last = await append_jobs(js, 400, site=True)  # 2,001 events: five batches of 500
    async with running_projector(js, database_url) as projector:
        await wait_for_position(database_url, last)
    # Nobody else wrote: everything folded ahead was written as folded.
    assert projector.written_ahead == projector.folded_ahead >= 1
    await applied_once(js, database_url, 400)


async def test_a_batch_folded_onto_one_whose_commit_failed_is_folded_again(
    js: JetStreamContext, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=CONSUMER_LOG)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        # In the second batch: the third is folded onto it while it commits, and fails.
        await conn.execute(FAIL_ONCE.format(seq=750).encode())
    last = await append_jobs(js, 400, site=True)
    async with running_projector(js, database_url) as projector:
        await wait_for_position(database_url, last)
    await logged(caplog, "injected failure at seq 750")
    # Thrown away: the failed batch's own fold ahead, and the third batch's, folded onto
    # what the failed attempt left.
    assert projector.folded_ahead - projector.written_ahead >= 2
    await applied_once(js, database_url, 400)


async def test_a_batch_folded_onto_one_postgres_refused_in_part_is_folded_again(
    js: JetStreamContext, database_url: str
) -> None:
    """The second batch creates a job Postgres refuses; the third, folded ahead onto the
    second while it committed, moves that job on. Written as folded, the job's later events
    would be rows of a job that does not exist; folded again, they are quarantined."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute("ALTER TABLE rm.jobs ADD CONSTRAINT refuse_evil CHECK (app <> 'evil')")
    # Created at seq 552 (second batch), its first step at seq 1,452 (third batch).
    created = [job_created(SITE, OWNER, app="evil" if n == EVIL else "good") for n in range(900)]
    steps = [lifecycle(c) for c in created]
    events: list[Event] = [site_registered(SITE, OWNER), *created]
    for wave in zip(*steps, strict=True):  # each job's next step, wave by wave
        events += wave
    results = await EventLog(js).append_many([(e, None) for e in events])
    last = max(r.seq for r in results if isinstance(r, Appended))
    async with running_projector(js, database_url) as projector:
        await wait_for_position(database_url, last)
    evil = created[EVIL].aggregate_id
    rows = await fetch_all(
        database_url, "SELECT count(*) FROM rm.job_events WHERE job_id = %s", evil
    )
    assert rows == [(0,)]
    reasons = await fetch_all(database_url, "SELECT reason FROM rm.quarantine ORDER BY seq")
    assert len(reasons) == 1 + len(steps[EVIL])
    assert "refuse_evil" in str(reasons[0][0])
    assert all("unknown job" in str(r[0]) for r in reasons[1:])
    assert projector.unstorable == 1
    live = await table_digest(database_url)
    assert (live["jobs"][0], live["job_events"][0]) == (899, 899 * 5)


async def fetch_all(dsn: str, query: str, *params: object) -> list[tuple[object, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(query.encode(), params)
        return await cursor.fetchall()


async def test_a_partial_batch_waits_the_linger_for_what_comes_next(
    js: JetStreamContext, database_url: str
) -> None:
    log = EventLog(js)
    first = (await log.append(site_registered(SITE, OWNER), expect=0)).seq
    async with running_projector(js, database_url, linger_s=2.0) as projector:
        async with asyncio.timeout(30):  # the first event is out, its batch lingering
            while not await has_delivered(js, first):
                await asyncio.sleep(0.01)
        last = await append_jobs(js, 3)
        await wait_for_position(database_url, last)
    assert projector.batches == 1
    assert projector.applied == last


# --- the fallbacks that only log: a fold ahead whose read fails, a linger whose fetch fails -


async def create_jobs(js: JetStreamContext, jobs: int) -> tuple[int, list[list[Event]]]:
    """``jobs`` jobs created (after the site): the last sequence, and each job's lifecycle
    steps still to append (:func:`append_waves`)."""
    created = [job_created(SITE, OWNER) for _ in range(jobs)]
    first = await _append(js, [site_registered(SITE, OWNER), *created])
    return first, [lifecycle(c) for c in created]


async def append_waves(js: JetStreamContext, steps: list[list[Event]]) -> int:
    """Every job's first step before any job's second; the last sequence."""
    return await _append(js, [s[wave] for wave in range(4) for s in steps])


async def _append(js: JetStreamContext, events: list[Event]) -> int:
    results = await EventLog(js).append_many([(e, None) for e in events])
    assert all(isinstance(r, Appended) for r in results)
    return max(r.seq for r in results if isinstance(r, Appended))


async def test_a_fold_ahead_whose_read_fails_is_folded_after_the_commit_before_it(
    js: JetStreamContext,
    database_url: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The jobs a batch folded ahead needs that the cache lacks are read on a second
    connection. A mock stands in for that connection failing once (a read on the live one
    cannot be made to fail alone): the batch is folded again after the one before it
    commits, the second connection is opened again for the next, and every event is
    applied once."""
    caplog.set_level(logging.INFO, logger=CONSUMER_LOG)
    created, steps = await create_jobs(js, 600)
    async with running_projector(js, database_url):  # a projector that then goes away
        await wait_for_position(database_url, created)
    # Only now the steps: however slow the machine, the first projector read none of them.
    last = await append_waves(js, steps)
    failed: list[bool] = []
    load_into = ProjectionStore.load_into

    async def fails_once_on_the_second_connection(
        store: ProjectionStore, conn: psycopg.AsyncConnection[Any], *args: Any
    ) -> None:
        if conn.autocommit and not failed:  # the fold ahead's (the live one is not)
            failed.append(True)
            raise psycopg.OperationalError("injected: the second connection is gone")
        await load_into(store, conn, *args)

    monkeypatch.setattr(ProjectionStore, "load_into", fails_once_on_the_second_connection)
    # A new projector holds none of the jobs: the second batch (the last hundred jobs'
    # first steps, not named by the first) is read for on the second connection.
    async with running_projector(js, database_url) as projector:
        await wait_for_position(database_url, last)
    assert failed == [True]
    await logged(caplog, "not folding ahead (injected: the second connection is gone)")
    assert projector.written_ahead == projector.folded_ahead >= 1  # read again, after
    await applied_once(js, database_url, 600)


async def test_a_linger_whose_fetch_fails_sends_its_batch_as_it_is(
    js: JetStreamContext, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mock reader stands in for the read failing (an outage that begins in the linger):
    the partial batch is folded as it is, and the next fetch reads what came."""
    failures: list[int] = []
    real = stream_reader

    class FailingLinger:
        def __init__(self, reader: StreamReader) -> None:
            self._reader = reader

        def __getattr__(self, name: str) -> Any:
            return getattr(self._reader, name)

        async def fetch(self, batch: int, timeout: float) -> list[RawMessage]:  # noqa: ASYNC109 - as the reader's
            if timeout == consumer.LINGER_POLL_S and len(failures) < 3:
                failures.append(batch)
                raise ReadError("injected: the connection dropped in the linger")
            return await self._reader.fetch(batch, timeout)

    monkeypatch.setattr(consumer, "stream_reader", lambda *a: FailingLinger(real(*a)))
    log = EventLog(js)
    first = (await log.append(site_registered(SITE, OWNER), expect=0)).seq
    async with running_projector(js, database_url, linger_s=0.05) as projector:
        await wait_for_position(database_url, first)
        last = await append_jobs(js, 3)
        await wait_for_position(database_url, last)
    assert failures  # each partial batch went on as it was
    assert projector.applied == last
    await applied_once(js, database_url, 3)


async def test_a_commit_that_fails_before_its_lock_does_not_fold_its_batch_twice(
    js: JetStreamContext, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each batch's first attempt loses its connection at the lock, as when Postgres
    restarts (a mock raises there; the real restart is `test_cluster_partition.py`). The
    batch before had kept the very Known this batch was folded ahead onto; the retry must
    fold from Postgres, not onto that Known again (which quarantined its events as "not
    after" themselves: found by the partition test)."""
    lock = ProjectionStore.lock
    calls: list[int] = []

    async def every_other_lock_fails(
        store: ProjectionStore, conn: psycopg.AsyncConnection[Any], stream: str
    ) -> Any:
        calls.append(1)
        if len(calls) % 2 == 0:
            raise psycopg.OperationalError("injected: the connection went at the lock")
        return await lock(store, conn, stream)

    monkeypatch.setattr(ProjectionStore, "lock", every_other_lock_fails)
    last = await append_jobs(js, 400, site=True)  # 2,001 events: five batches of 500
    async with running_projector(js, database_url) as projector:
        await wait_for_position(database_url, last)
    assert projector.folded_ahead >= 1
    monkeypatch.undo()  # the rebuild that judges it locks the positions too
    await applied_once(js, database_url, 400)
