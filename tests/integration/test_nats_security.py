"""Sites over wss:// with per-site nkeys: what they can do, and what the server refuses.

Every refusal is observed as the server's ``Permissions Violation`` reaching
the client's ``error_cb``, never inferred from a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any

import pytest
from nats.aio.client import Client
from nats.errors import NoServersError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import NotFoundError

from lodestream.eventlog.streams import ensure_streams
from lodestream.natsconn import connect
from lodestream.schemas.subjects import EVENTS_STREAM
from tests.fixtures.nats import ErrorLog, SecureNats, connect_site


@dataclass
class Site:
    nc: Client
    js: JetStreamContext
    errors: ErrorLog


@pytest.fixture
async def control(secure_nats: SecureNats) -> AsyncIterator[JetStreamContext]:
    """The control plane: streams, plus the launch consumers it creates for both sites."""
    nc = await connect(secure_nats.settings())
    js = nc.jetstream()
    await ensure_streams(js)
    for site in ("alpha", "beta"):
        await js.add_consumer(
            EVENTS_STREAM,
            ConsumerConfig(
                durable_name=f"launch-{site}",
                filter_subject=f"evt.{site}.>",
                ack_policy=AckPolicy.EXPLICIT,
            ),
        )
    try:
        yield js
    finally:
        await nc.close()


@pytest.fixture
async def alpha(secure_nats: SecureNats, control: JetStreamContext) -> AsyncIterator[Site]:
    errors = ErrorLog()
    nc = await connect_site(secure_nats, "alpha", errors)
    try:
        yield Site(nc, nc.jetstream(), errors)
    finally:
        await nc.close()


async def _refused(site: Site, request: Awaitable[Any], action: str, subject: str) -> None:
    """Run ``request`` until the server reports the violation for ``subject``, then drop it."""
    after = len(site.errors.errors)
    task = asyncio.ensure_future(request)
    try:
        await site.errors.violation(action, subject, after=after)
        assert not (task.done() and task.exception() is None), "the request got an answer"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def test_site_publishes_to_jetstream_over_wss(alpha: Site) -> None:
    assert alpha.nc.connected_url is not None
    assert alpha.nc.connected_url.scheme == "wss"
    ack = await alpha.js.publish(f"evt.alpha.job.{uuid.uuid4()}.started", b"{}")
    assert ack.stream == EVENTS_STREAM
    assert ack.seq >= 1
    hb = await alpha.js.publish(f"hb.alpha.{uuid.uuid4()}", b"")
    assert hb.stream == "HBIN"
    assert alpha.errors.errors == []


async def test_wss_without_the_local_ca_fails_verification(secure_nats: SecureNats) -> None:
    errors = ErrorLog()
    with pytest.raises(NoServersError):
        await connect_site(
            secure_nats,
            "alpha",
            errors,
            tls=ssl.create_default_context(),  # system roots only
            max_reconnect_attempts=1,
            reconnect_time_wait=0,
        )
    assert errors.errors
    for exc in errors.errors:
        assert isinstance(exc, ssl.SSLCertVerificationError) or isinstance(
            getattr(exc, "certificate_error", None), ssl.SSLCertVerificationError
        ), exc


async def test_alpha_cannot_publish_to_beta(alpha: Site, control: JetStreamContext) -> None:
    subject = "evt.beta.job.x.created"
    await alpha.nc.publish(subject, b"{}")
    await alpha.nc.flush()
    error = await alpha.errors.violation("publish", subject)
    assert "permissions violation" in str(error).lower()
    assert subject in str(error)

    await _refused(alpha, alpha.js.publish(subject, b"{}"), "publish", subject)
    await _refused(alpha, alpha.js.publish("hb.beta.s1", b""), "publish", "hb.beta.s1")
    with pytest.raises(NotFoundError):
        await control.get_last_msg(EVENTS_STREAM, subject)
    assert alpha.nc.is_connected  # a violation is reported, not punished with a disconnect


@pytest.mark.parametrize("subject", ["evt.>", "evt.beta.>", "hb.>", "_INBOX_beta.>", ">"])
async def test_alpha_cannot_subscribe_outside_its_inbox(alpha: Site, subject: str) -> None:
    await alpha.nc.subscribe(subject)
    await alpha.nc.flush()
    await alpha.errors.violation("subscription", subject)


async def test_alpha_fetches_and_acks_from_its_own_consumer_only(
    alpha: Site, control: JetStreamContext
) -> None:
    await control.publish("evt.alpha.job.a1.preprocessed", b"alpha-work")
    await control.publish("evt.beta.job.b1.preprocessed", b"beta-work")

    own = await alpha.js.pull_subscribe_bind("launch-alpha", stream=EVENTS_STREAM)
    (msg,) = await own.fetch(1, timeout=10)
    assert msg.data == b"alpha-work"
    await msg.ack_sync()
    info = await alpha.js.consumer_info(EVENTS_STREAM, "launch-alpha")
    assert info.num_ack_pending == 0
    assert info.num_pending == 0

    other = await alpha.js.pull_subscribe_bind("launch-beta", stream=EVENTS_STREAM)
    await _refused(
        alpha, other.fetch(1, timeout=30), "publish", "$JS.API.CONSUMER.MSG.NEXT.EVENTS.launch-beta"
    )
    beta_info = await control.consumer_info(EVENTS_STREAM, "launch-beta")
    assert beta_info.delivered.stream_seq == 0
    assert beta_info.num_pending == 1


async def test_alpha_cannot_ack_for_beta(alpha: Site) -> None:
    subject = "$JS.ACK.EVENTS.launch-beta.1.2.2.1700000000000000000.0"
    await alpha.nc.publish(subject, b"+ACK")
    await alpha.nc.flush()
    await alpha.errors.violation("publish", subject)


def _api(site: Site, subject: str, payload: dict[str, Any]) -> Awaitable[Any]:
    return site.nc.request(subject, json.dumps(payload).encode(), timeout=30)


@pytest.mark.parametrize(
    ("subject", "payload"),
    [
        pytest.param("$JS.API.STREAM.MSG.GET.EVENTS", {"seq": 1}, id="stream-msg-get"),
        pytest.param("$JS.API.DIRECT.GET.EVENTS", {"seq": 1}, id="direct-get"),
        pytest.param("$JS.API.STREAM.INFO.EVENTS", {}, id="stream-info"),
        pytest.param("$JS.API.STREAM.NAMES", {}, id="stream-names"),
        pytest.param(
            "$JS.API.CONSUMER.CREATE.EVENTS.mine-alpha",
            {"stream_name": "EVENTS", "config": {"name": "mine-alpha"}},
            id="create-consumer",
        ),
        pytest.param(
            "$JS.API.CONSUMER.DURABLE.CREATE.EVENTS.launch-alpha",
            {"stream_name": "EVENTS", "config": {"durable_name": "launch-alpha"}},
            id="create-own-durable",
        ),
        pytest.param("$JS.API.CONSUMER.DELETE.EVENTS.launch-alpha", {}, id="delete-own-consumer"),
        pytest.param("$JS.API.CONSUMER.INFO.EVENTS.launch-beta", {}, id="beta-consumer-info"),
        pytest.param("$JS.API.STREAM.PURGE.EVENTS", {}, id="purge"),
    ],
)
async def test_alpha_cannot_read_the_stream_or_manage_consumers(
    alpha: Site, subject: str, payload: dict[str, Any]
) -> None:
    await _refused(alpha, _api(alpha, subject, payload), "publish", subject)


async def test_nats_py_stream_reads_are_refused(alpha: Site) -> None:
    """The same refusals through nats-py's own calls, as a careless site agent would make them."""
    await _refused(
        alpha, alpha.js.get_msg(EVENTS_STREAM, 1), "publish", "$JS.API.STREAM.MSG.GET.EVENTS"
    )
    await _refused(
        alpha,
        alpha.js.get_msg(EVENTS_STREAM, 1, direct=True),
        "publish",
        "$JS.API.DIRECT.GET.EVENTS",
    )
    await _refused(
        alpha,
        alpha.js.add_consumer(EVENTS_STREAM, ConsumerConfig(durable_name="sneaky-alpha")),
        "publish",
        "$JS.API.CONSUMER.DURABLE.CREATE.EVENTS.sneaky-alpha",
    )
