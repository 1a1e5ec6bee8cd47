"""The controller against real nats-server and Postgres, with a live projector."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import orjson
import psycopg
import pytest
from nats.js import JetStreamContext

from lodestream.eventlog import ConflictError, EventLog
from lodestream.eventlog.kernel import commit
from lodestream.schemas.events import (
    Heartbeat,
    JobKilled,
    JobRunDone,
    JobStarted,
    SessionClosed,
    SessionOpened,
)
from lodestream.schemas.events.job import RunResultData, StartedData
from lodestream.schemas.events.session import SessionClosedData, SessionOpenedData
from lodestream.schemas.resources import NodeInfo
from lodestream.schemas.subjects import EVENTS_STREAM, HB_STREAM, heartbeat_subject
from lodestream.services.controller import loop as loop_module
from lodestream.services.controller.loop import Controller
from tests.support.builders import job_created, site_registered
from tests.support.processes import TEST_HEARTBEAT_TTL_S
from tests.support.projection import running_projector, wait_for_position
from tests.support.running import running_until_stopped

SITE, OWNER = "alpha", "ada"


@asynccontextmanager
async def running_controller(js: JetStreamContext, dsn: str) -> AsyncIterator[Controller]:
    controller = Controller(js, dsn)
    async with running_until_stopped(controller.run, stop_timeout_s=10):
        yield controller


async def history(dsn: str, job_id: uuid.UUID) -> list[str]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT type FROM rm.job_events WHERE job_id = %s ORDER BY seq", (job_id,)
        )
        return [r[0] for r in await cursor.fetchall()]


async def until_looked(js: JetStreamContext, stream: str, durable: str, seq: int) -> None:
    """Until the controller has decided on and acked ``seq`` of ``stream``: it acks a message
    only after appending what it decided, so anything it would append is on the log now."""
    async with asyncio.timeout(20):
        while (await js.consumer_info(stream, durable)).ack_floor.stream_seq < seq:
            await asyncio.sleep(0.05)


async def until_idle(js: JetStreamContext, durable: str = "controller") -> None:
    """Until the controller has acked everything on both its streams and waits for more: a
    restarted one has then looked at all it was going to be handed."""
    async with asyncio.timeout(20):
        for stream, name in ((EVENTS_STREAM, durable), (HB_STREAM, f"{durable}-hb")):
            while True:
                info = await js.consumer_info(stream, name)
                if not (info.num_pending or info.num_ack_pending) and info.num_waiting:
                    break
                await asyncio.sleep(0.05)


async def state_of(dsn: str, job_id: uuid.UUID) -> tuple[str, int] | None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute("SELECT state, last_seq FROM rm.jobs WHERE id = %s", (job_id,))
        row = await cursor.fetchone()
        return (str(row[0]), int(row[1])) if row else None


async def until_state(dsn: str, job_id: uuid.UUID, state: str, timeout_s: float = 20) -> int:
    async with asyncio.timeout(timeout_s):
        while True:
            current = await state_of(dsn, job_id)
            if current and current[0] == state:
                return current[1]
            await asyncio.sleep(0.02)


async def run_to_done(log: EventLog, job_id: uuid.UUID, after: int) -> int:
    """What a launcher appends: start (taking the lease) and finish, chained by CAS."""
    session = uuid.uuid4()
    started = JobStarted.create(
        site=SITE, aggregate_id=job_id, actor=f"launcher:{session}",
        data=StartedData(session_id=session, skipped=("job.leased",)),
    )  # fmt: skip
    seq = (await log.append(started, expect=after)).seq
    done = JobRunDone.create(
        site=SITE, aggregate_id=job_id, actor=f"launcher:{session}",
        data=RunResultData(return_code=0),
    )  # fmt: skip
    return (await log.append(done, expect=seq)).seq


async def test_a_controller_ahead_of_the_read_model_decides_nothing_until_it_catches_up(
    js: JetStreamContext,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The awaited-parents set is loaded from the read model, so the controller must not start
    # before the projector has folded the stream; it waits (retrying) instead of deciding.
    log = EventLog(js)
    await log.append(site_registered(SITE, OWNER), expect=0)
    created = job_created(SITE, OWNER)
    await log.append(created, expect=0)
    before = (await js.stream_info(EVENTS_STREAM)).state.last_seq
    monkeypatch.setattr(loop_module, "STARTUP_WAIT_S", 0.3)
    async with running_controller(js, database_url):
        async with asyncio.timeout(10):  # two start attempts, each timing out on the read model
            while sum("cannot start yet" in r.getMessage() for r in caplog.records) < 2:
                await asyncio.sleep(0.05)
        assert (await js.stream_info(EVENTS_STREAM)).state.last_seq == before  # appended nothing
        durables = {info.name for info in await js.consumers_info(EVENTS_STREAM)}
        assert "controller" not in durables  # nor took a position on the stream

        # The same controller, once the projector is there, starts and decides.
        async with running_projector(js, database_url):
            await until_state(database_url, created.aggregate_id, "PREPROCESSED")
    assert await history(database_url, created.aggregate_id) == ["job.created", "job.preprocessed"]


async def test_a_job_without_parents_becomes_runnable_in_one_step_and_finishes(
    js: JetStreamContext, database_url: str
) -> None:
    log = EventLog(js)
    await log.append(site_registered(SITE, OWNER), expect=0)
    created = job_created(SITE, OWNER)
    await log.append(created, expect=0)
    async with running_projector(js, database_url), running_controller(js, database_url):
        seq = await until_state(database_url, created.aggregate_id, "PREPROCESSED")
        await run_to_done(log, created.aggregate_id, seq)
        await until_state(database_url, created.aggregate_id, "JOB_FINISHED")
    assert await history(database_url, created.aggregate_id) == [
        "job.created", "job.preprocessed", "job.started", "job.run_done", "job.finished",
    ]  # fmt: skip


async def test_dag_children_wait_for_all_parents_then_run(
    js: JetStreamContext, database_url: str
) -> None:
    log = EventLog(js)
    await log.append(site_registered(SITE, OWNER), expect=0)
    left, right = job_created(SITE, OWNER), job_created(SITE, OWNER)
    child = job_created(SITE, OWNER, parent_ids=[left.aggregate_id, right.aggregate_id])
    for event in (left, right, child):
        await log.append(event, expect=0)
    async with running_projector(js, database_url), running_controller(js, database_url):
        await until_state(database_url, child.aggregate_id, "AWAITING_PARENTS")
        seq = await until_state(database_url, left.aggregate_id, "PREPROCESSED")
        await run_to_done(log, left.aggregate_id, seq)
        await until_state(database_url, left.aggregate_id, "JOB_FINISHED")
        await asyncio.sleep(0.3)  # give a wrong release the chance to happen
        assert (await state_of(database_url, child.aggregate_id) or ("",))[0] == "AWAITING_PARENTS"
        seq = await until_state(database_url, right.aggregate_id, "PREPROCESSED")
        await run_to_done(log, right.aggregate_id, seq)
        await until_state(database_url, child.aggregate_id, "PREPROCESSED")
    assert await history(database_url, child.aggregate_id) == [
        "job.created", "job.awaiting_parents", "job.preprocessed",
    ]  # fmt: skip


async def test_a_restarted_controller_still_releases_children_waiting_since_before(
    js: JetStreamContext, database_url: str
) -> None:
    """The awaited parents are learnt from the read model at start, not only from job.created."""
    log = EventLog(js)
    await log.append(site_registered(SITE, OWNER), expect=0)
    parent = job_created(SITE, OWNER)
    child = job_created(SITE, OWNER, parent_ids=[parent.aggregate_id])
    loner = job_created(SITE, OWNER)
    for event in (parent, child, loner):
        await log.append(event, expect=0)
    async with running_projector(js, database_url):
        async with running_controller(js, database_url):
            await until_state(database_url, child.aggregate_id, "AWAITING_PARENTS")
            seq = await until_state(database_url, parent.aggregate_id, "PREPROCESSED")
            loner_seq = await until_state(database_url, loner.aggregate_id, "PREPROCESSED")
        async with running_controller(js, database_url):
            await run_to_done(log, parent.aggregate_id, seq)
            await run_to_done(log, loner.aggregate_id, loner_seq)
            await until_state(database_url, child.aggregate_id, "PREPROCESSED")
            await until_state(database_url, loner.aggregate_id, "JOB_FINISHED")
    assert await history(database_url, child.aggregate_id) == [
        "job.created", "job.awaiting_parents", "job.preprocessed",
    ]  # fmt: skip


async def test_a_child_created_after_its_parent_finished_starts_at_once(
    js: JetStreamContext, database_url: str
) -> None:
    log = EventLog(js)
    await log.append(site_registered(SITE, OWNER), expect=0)
    parent = job_created(SITE, OWNER)
    await log.append(parent, expect=0)
    async with running_projector(js, database_url), running_controller(js, database_url):
        seq = await until_state(database_url, parent.aggregate_id, "PREPROCESSED")
        await run_to_done(log, parent.aggregate_id, seq)
        await until_state(database_url, parent.aggregate_id, "JOB_FINISHED")
        child = job_created(SITE, OWNER, parent_ids=[parent.aggregate_id])
        await log.append(child, expect=0)
        await until_state(database_url, child.aggregate_id, "PREPROCESSED")
    assert await history(database_url, child.aggregate_id) == ["job.created", "job.preprocessed"]


async def test_a_child_created_in_the_batch_where_its_parent_ends_is_decided(
    js: JetStreamContext, database_url: str
) -> None:
    """A controller that knows no awaited parent still fails the child of a parent killed in
    the same batch (the child's creation reads the parent's state as of the whole batch)."""
    log = EventLog(js)
    await log.append(site_registered(SITE, OWNER), expect=0)
    parent = job_created(SITE, OWNER)
    parent_seq = (await log.append(parent, expect=0)).seq
    child = job_created(SITE, OWNER, parent_ids=[parent.aggregate_id])
    seqs = [(await log.append(child, expect=0)).seq]
    kill = JobKilled.create(site=SITE, aggregate_id=parent.aggregate_id, actor=f"user:{OWNER}")
    seqs.append((await log.append(kill, expect=parent_seq)).seq)
    async with running_projector(js, database_url):
        await wait_for_position(database_url, seqs[-1])
        controller = Controller(js, database_url)  # not started: it knows no awaited parent
        controller._owners = {SITE: OWNER}  # ...but, as after any start, the live sites
        batch = [delivered(await js.get_msg(EVENTS_STREAM, seq)) for seq in seqs]
        decision = await controller._on_events(batch)
        await commit(log, decision.appends)  # as the consumer kernel does next
        await until_state(database_url, child.aggregate_id, "FAILED")


def delivered(raw: Any) -> SimpleNamespace:
    """A stored message as a consumer delivers it (what the controller reads of one)."""
    sequence = SimpleNamespace(stream=raw.seq)
    return SimpleNamespace(subject=raw.subject, data=raw.data,
                           metadata=SimpleNamespace(sequence=sequence))  # fmt: skip


async def test_failure_propagates_down_the_dag_with_its_cause(
    js: JetStreamContext, database_url: str
) -> None:
    log = EventLog(js)
    await log.append(site_registered(SITE, OWNER), expect=0)
    root = job_created(SITE, OWNER)
    child = job_created(SITE, OWNER, parent_ids=[root.aggregate_id])
    grandchild = job_created(SITE, OWNER, parent_ids=[child.aggregate_id])
    for event in (root, child, grandchild):
        await log.append(event, expect=0)
    async with running_projector(js, database_url), running_controller(js, database_url):
        await until_state(database_url, grandchild.aggregate_id, "AWAITING_PARENTS")
        seq = await until_state(database_url, root.aggregate_id, "PREPROCESSED")
        kill = JobKilled.create(site=SITE, aggregate_id=root.aggregate_id, actor=f"user:{OWNER}")
        await log.append(kill, expect=seq)
        await until_state(database_url, grandchild.aggregate_id, "FAILED")
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cursor = await conn.execute(
            "SELECT last_error FROM rm.jobs WHERE id = %s", (grandchild.aggregate_id,)
        )
        (error,) = await cursor.fetchone() or ("",)
    assert f"parent {child.aggregate_id} FAILED" in error


async def test_dead_session_is_fenced_and_a_restart_re_emits_nothing(
    js: JetStreamContext, database_url: str
) -> None:
    log = EventLog(js)
    await log.append(site_registered(SITE, OWNER), expect=0)
    created = job_created(SITE, OWNER)
    await log.append(created, expect=0)
    session = uuid.uuid4()
    async with running_projector(js, database_url):
        async with running_controller(js, database_url):
            seq = await until_state(database_url, created.aggregate_id, "PREPROCESSED")
            heartbeat = Heartbeat(session_id=session, site=SITE, at=datetime.now(UTC))
            await js.publish(
                heartbeat_subject(SITE, session), orjson.dumps(heartbeat.model_dump(mode="json")),
            )  # fmt: skip
            started = JobStarted.create(
                site=SITE, aggregate_id=created.aggregate_id, actor=f"launcher:{session}",
                data=StartedData(session_id=session, skipped=("job.leased",)),
            )  # fmt: skip
            lease = (await log.append(started, expect=seq)).seq
            # No more heartbeats: the server's TTL expires it and the controller fences.
            await until_state(database_url, created.aggregate_id, "RUN_TIMEOUT", timeout_s=30)
            # The zombie's late result is refused: its chain is broken.
            late = JobRunDone.create(
                site=SITE, aggregate_id=created.aggregate_id, actor=f"launcher:{session}",
                data=RunResultData(return_code=0),
            )  # fmt: skip
            with pytest.raises(ConflictError):
                await log.append(late, expect=lease)
        info = await js.stream_info(EVENTS_STREAM)
        before = info.state.last_seq
        async with running_controller(js, database_url):
            await until_idle(js)
        info = await js.stream_info(EVENTS_STREAM)
        assert info.state.last_seq == before
        await wait_for_position(database_url, before)
    assert await history(database_url, created.aggregate_id) == [
        "job.created", "job.preprocessed", "job.started", "job.run_timed_out",
    ]  # fmt: skip


async def test_a_closed_sessions_last_heartbeat_ageing_out_leaves_it_closed(
    js: JetStreamContext, database_url: str
) -> None:
    """A pilot that closes its session stops beating; its last heartbeat ages out as any
    does. The marker that follows must not turn the closed session into an expired one."""
    log = EventLog(js)
    await log.append(site_registered(SITE, OWNER), expect=0)
    session = uuid.uuid4()
    actor = f"launcher:{session}"
    opened = SessionOpened.create(
        site=SITE, aggregate_id=session, actor=actor,
        data=SessionOpenedData(hostname="nid1", nodes=(NodeInfo(hostname="nid1", cores=4),),
                               deadline=datetime.now(UTC) + timedelta(hours=1),
                               heartbeat_ttl_s=TEST_HEARTBEAT_TTL_S),
    )  # fmt: skip
    opened_seq = (await log.append(opened, expect=0)).seq
    heartbeat = Heartbeat(session_id=session, site=SITE, at=datetime.now(UTC))
    await js.publish(
        heartbeat_subject(SITE, session), orjson.dumps(heartbeat.model_dump(mode="json"))
    )
    closed = SessionClosed.create(
        site=SITE, aggregate_id=session, actor=actor, data=SessionClosedData(reason="idle")
    )
    await log.append(closed, expect=opened_seq)
    async with running_projector(js, database_url), running_controller(js, database_url):
        async with asyncio.timeout(30):  # the heartbeat ages out: HB holds only its marker
            while (await js.stream_info(HB_STREAM)).state.messages != 1 or (
                await js.get_last_msg(HB_STREAM, heartbeat_subject(SITE, session))
            ).data:
                await asyncio.sleep(0.1)
        marker = (await js.get_last_msg(HB_STREAM, heartbeat_subject(SITE, session))).seq
        assert marker is not None
        await until_looked(js, HB_STREAM, "controller-hb", marker)  # its turn at the marker
        last = (await js.stream_info(EVENTS_STREAM)).state.last_seq
        await wait_for_position(database_url, last)
    newest = await js.get_last_msg(EVENTS_STREAM, f"evt.{SITE}.session.{session}.>")
    assert newest.subject == closed.subject
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cursor = await conn.execute("SELECT state FROM rm.sessions WHERE id = %s", (session,))
        assert await cursor.fetchall() == [("closed",)]


async def test_a_session_with_a_quarantined_message_after_its_open_still_expires(
    js: JetStreamContext, database_url: str
) -> None:
    """A site wrote garbage on its own session's subject after opening it: the projector
    quarantines it, so the read model's newest event of the session is the open, while
    the log's is the garbage. The expiry is compare-and-set on the log's newest (all after
    the open is quarantined), not lost in every round."""
    log = EventLog(js)
    await log.append(site_registered(SITE, OWNER), expect=0)
    session = uuid.uuid4()
    opened = SessionOpened.create(
        site=SITE, aggregate_id=session, actor=f"launcher:{session}",
        data=SessionOpenedData(hostname="nid1", nodes=(NodeInfo(hostname="nid1", cores=4),),
                               deadline=datetime.now(UTC) + timedelta(hours=1),
                               heartbeat_ttl_s=TEST_HEARTBEAT_TTL_S),
    )  # fmt: skip
    await log.append(opened, expect=0)
    garbage = (await js.publish(f"evt.{SITE}.session.{session}.closed", b"garbage")).seq
    heartbeat = Heartbeat(session_id=session, site=SITE, at=datetime.now(UTC))
    await js.publish(
        heartbeat_subject(SITE, session), orjson.dumps(heartbeat.model_dump(mode="json"))
    )
    async with running_projector(js, database_url), running_controller(js, database_url):
        await wait_for_position(database_url, garbage)
        async with asyncio.timeout(30):  # the heartbeat ages out; the controller expires it
            newest = f"evt.{SITE}.session.{session}.>"
            while not str((await js.get_last_msg(EVENTS_STREAM, newest)).subject).endswith(
                ".expired"
            ):
                await asyncio.sleep(0.1)
        last = (await js.stream_info(EVENTS_STREAM)).state.last_seq
        await wait_for_position(database_url, last)
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cursor = await conn.execute(
            "SELECT state, last_seq FROM rm.sessions WHERE id = %s", (session,)
        )
        assert await cursor.fetchall() == [("expired", last)]
        cursor = await conn.execute("SELECT seq FROM rm.quarantine")
        assert await cursor.fetchall() == [(garbage,)]


async def test_a_job_the_projector_refuses_to_create_is_not_acted_on(
    js: JetStreamContext, database_url: str
) -> None:
    """A job.created for a site nobody registered, or signed by someone else than the site's
    owner, is quarantined by the projector; the controller must not preprocess it either
    (it would then run although the read model never shows it)."""
    log = EventLog(js)
    await log.append(site_registered(SITE, OWNER), expect=0)
    unregistered = job_created("gamma", OWNER)
    not_owner = job_created(SITE, "mallory")
    fine = job_created(SITE, OWNER)
    for event in (unregistered, not_owner, fine):
        await log.append(event, expect=0)
    async with running_projector(js, database_url), running_controller(js, database_url) as c:
        await until_state(database_url, fine.aggregate_id, "PREPROCESSED")
        assert c.refused == 2
    for refused in (unregistered, not_owner):
        # Only job.created is there: anything newer would be the controller's next step.
        last = await js.get_last_msg(EVENTS_STREAM, refused.aggregate_subjects)
        assert last.subject == refused.subject


async def test_a_marker_is_overruled_by_a_newer_heartbeat_waiting_in_hbin(
    js: JetStreamContext, database_url: str
) -> None:
    """HB sources its heartbeats from HBIN, and the source stalls while a cluster moves a
    leader: HB can age out a live pilot's heartbeat while a newer one waits in HBIN. The
    marker then must not expire the session; once HBIN holds nothing newer, it does."""
    log = EventLog(js)
    await log.append(site_registered(SITE, OWNER), expect=0)
    session = uuid.uuid4()
    ttl_s = float((await js.stream_info(HB_STREAM)).config.max_age or 0)
    async with running_projector(js, database_url):
        await wait_for_position(database_url, 1)
        heartbeat = Heartbeat(session_id=session, site=SITE, at=datetime.now(UTC))
        await js.publish(
            heartbeat_subject(SITE, session), orjson.dumps(heartbeat.model_dump(mode="json"))
        )
        controller = Controller(js, database_url)  # not started: only its expiry is asked
        # A marker arriving now, as if HB had aged out an older heartbeat of this session.
        await controller._expire(SITE, session, marker_seq=1)
        assert (await js.stream_info(EVENTS_STREAM)).state.last_seq == 1
        # HBIN's heartbeat more than half a TTL old: the marker's verdict stands.
        await asyncio.sleep(ttl_s / 2 + 0.2)
        await controller._expire(SITE, session, marker_seq=1)
    last = await js.get_msg(EVENTS_STREAM, seq=(await js.stream_info(EVENTS_STREAM)).state.last_seq)
    assert last.subject == f"evt.{SITE}.session.{session}.expired"
