"""A site's websocket connection sends each flush as one frame: appends issued together share
frames, and keep their order, their compare-and-set and their independence."""

from __future__ import annotations

import asyncio
import uuid
import warnings
from collections.abc import AsyncIterator
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from lodestream import natsprivate
from lodestream.eventlog import Appended, ConflictError, EventLog
from lodestream.eventlog.streams import ensure_streams
from lodestream.infra.nats.auth import site_inbox_prefix
from lodestream.natsconn import CoalescingWebSocketTransport, connect
from lodestream.schemas.events import JobStarted
from lodestream.schemas.events.job import StartedData
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.settings import NatsSettings
from tests.fixtures.nats import SecureNats

SITE = "alpha"


@pytest.fixture
async def control(secure_nats: SecureNats) -> AsyncIterator[JetStreamContext]:
    nc = await connect(secure_nats.settings())
    js = nc.jetstream()
    await ensure_streams(js)
    try:
        yield js
    finally:
        await nc.close()


@pytest.fixture
async def site_nc(secure_nats: SecureNats, control: JetStreamContext) -> AsyncIterator[Client]:
    """The site's connection as a pilot opens it: wss://, the local CA, its nkey."""
    settings = NatsSettings(
        url=secure_nats.server.websocket_url,
        ca_file=secure_nats.ca_file,
        nkey_seed_file=secure_nats.seed_files[SITE],
        inbox_prefix=site_inbox_prefix(SITE),
    )
    with warnings.catch_warnings():
        # nats-py passes a float timeout to aiohttp's ws_connect, which aiohttp deprecates.
        warnings.filterwarnings(
            "ignore", "parameter 'timeout' of type 'float' is deprecated", DeprecationWarning
        )
        nc = await connect(settings, allow_reconnect=False)
    try:
        yield nc
    finally:
        await nc.close()


def _count_frames(nc: Client) -> list[int]:
    """Record the size of every websocket frame ``nc`` sends from now on."""
    transport = natsprivate.transport_of(nc)
    assert isinstance(transport, CoalescingWebSocketTransport)
    ws: Any = transport._ws
    sizes: list[int] = []
    send_bytes = ws.send_bytes

    async def counted(data: bytes, *args: Any, **kwargs: Any) -> None:
        sizes.append(len(data))
        await send_bytes(data, *args, **kwargs)

    ws.send_bytes = counted
    return sizes


def _started(job_id: uuid.UUID) -> JobStarted:
    return JobStarted.create(
        site=SITE, aggregate_id=job_id, actor=f"launcher:{uuid.uuid4()}",
        data=StartedData(session_id=uuid.uuid4(), skipped=("job.leased",)),
    )  # fmt: skip


async def test_appends_issued_together_share_frames(site_nc: Client) -> None:
    log = EventLog(site_nc.jetstream())
    frames = _count_frames(site_nc)
    events = [_started(uuid.uuid4()) for _ in range(50)]
    outcomes = await asyncio.gather(*(log.append(e, expect=0) for e in events))
    assert all(isinstance(o, Appended) and not o.duplicate for o in outcomes)
    assert len({o.seq for o in outcomes}) == len(events)
    # nats-py's own transport sends one frame per publish: 50 here.
    assert 1 <= len(frames) <= 5


async def test_a_shared_frame_keeps_issue_order_and_compare_and_set(site_nc: Client) -> None:
    """Two leases of one job issued back to back, for many jobs at once: the first of each
    pair wins and the second is refused, so the server saw every pair in the order issued;
    a refusal in the batch loses none of the other appends."""
    log = EventLog(site_nc.jetstream())
    frames = _count_frames(site_nc)
    jobs = [uuid.uuid4() for _ in range(20)]
    pairs = [(_started(job), _started(job)) for job in jobs]
    issued = [log.append(event, expect=0) for pair in pairs for event in pair]
    outcomes = await asyncio.gather(*issued, return_exceptions=True)
    firsts, seconds = outcomes[0::2], outcomes[1::2]
    assert all(isinstance(o, Appended) for o in firsts), firsts
    assert all(isinstance(o, ConflictError) for o in seconds), seconds
    assert len(frames) < len(issued)
    # The winners are on the log, one lease per job, at the sequences acknowledged.
    js = site_nc.jetstream()
    for (winner, _), outcome in zip(pairs, firsts, strict=True):
        assert isinstance(outcome, Appended)
        stored = await js.get_msg(EVENTS_STREAM, subject=winner.subject, direct=True)
        assert stored.seq == outcome.seq
        assert (stored.headers or {}).get("Nats-Msg-Id") == str(winner.id)


async def test_a_flush_of_megabytes_is_one_stream_the_server_reads_whole(site_nc: Client) -> None:
    """More than nats-py's pending limit (2 MiB) issued at once: frames of megabytes, each
    command whole on the log."""
    log = EventLog(site_nc.jetstream(), timeout_s=30.0)
    frames = _count_frames(site_nc)
    events = [_started(uuid.uuid4()) for _ in range(6000)]
    outcomes = await asyncio.gather(*(log.append(e, expect=0) for e in events))
    assert all(isinstance(o, Appended) for o in outcomes)
    assert max(frames) > 1024 * 1024
