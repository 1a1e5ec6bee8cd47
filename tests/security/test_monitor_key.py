"""What a user's monitoring key may do on the bus: read its own sites' events, nothing else.

Each probe is judged by nats-server over wss, as in ``test_permission_matrix``: a
``Permissions Violation`` is a denial. The key of user ada holds site alpha; beta is
another user's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import warnings
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from lodestream.client.credential import MonitorCredential
from lodestream.infra.nats.monitor import consumer_names, create_subject, monitor_inbox_prefix
from lodestream.schemas.subjects import EVENTS_STREAM, HB_IN_STREAM, HB_STREAM
from lodestream.settings import NatsSettings
from tests.fixtures.nats import SecureNats
from tests.security.attack import Violations, try_publish, try_subscribe
from tests.support.builders import job_created
from tests.support.watching import append_jobs, monitor_for


@pytest.fixture
def nats_settings(secure_nats: SecureNats) -> NatsSettings:
    return secure_nats.settings()


@contextlib.asynccontextmanager
async def monitor_connection(
    secure: SecureNats, credential: MonitorCredential, violations: Violations
) -> AsyncIterator[Client]:
    nc = Client()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "parameter 'timeout'", DeprecationWarning)
        try:
            await nc.connect(
                servers=[secure.server.websocket_url],
                tls=ssl.create_default_context(cafile=str(secure.ca_file)),
                nkeys_seed_str=credential.seed,
                inbox_prefix=monitor_inbox_prefix(credential.public_key),
                error_cb=violations.record,
                allow_reconnect=False,
            )
        except BaseException:
            await nc.close()
            raise
    try:
        yield nc
    finally:
        await nc.close()


def create(name: str, filter_subject: str, **config: object) -> bytes:
    body = {"stream_name": EVENTS_STREAM, "action": "create",
            "config": {"name": name, "filter_subject": filter_subject, "ack_policy": "none",
                       "deliver_policy": "all", **config}}  # fmt: skip
    return json.dumps(body).encode()


async def test_monitoring_key_reads_own_site_and_nothing_else(
    secure_nats: SecureNats, js: JetStreamContext
) -> None:
    await append_jobs(js, "alpha", 1)
    await append_jobs(js, "beta", 1)
    credential = monitor_for(secure_nats, ["alpha"])
    mine, other = consumer_names(credential.public_key)[:2]
    v = Violations()
    async with monitor_connection(secure_nats, credential, v) as nc:
        # Its own site: a consumer, and a pull of its events.
        made = await try_publish(nc, v, create_subject(mine, "alpha"), create(mine, "evt.alpha.>"))
        assert not made.refused
        assert "error" not in made.json, made.answer
        pulled = await try_publish(
            nc, v, f"$JS.API.CONSUMER.MSG.NEXT.{EVENTS_STREAM}.{mine}", b'{"batch": 1}'
        )
        assert not pulled.refused
        assert json.loads(pulled.answer)["type"] == "job.created"

        denied: list[tuple[str, bytes]] = [
            # no publish of events or heartbeats, its own site's included
            (job_created("alpha", "ada").subject, b"{}"),
            (job_created("beta", "bob").subject, b"{}"),
            ("hb.alpha.x", b"{}"),
            # another user's site, under any name, with any filter
            (create_subject(other, "beta"), create(other, "evt.beta.>")),
            (f"$JS.API.CONSUMER.CREATE.{EVENTS_STREAM}.{mine}.evt.>", create(mine, "evt.>")),
            (f"$JS.API.CONSUMER.CREATE.{EVENTS_STREAM}.{mine}.evt.*.>", create(mine, "evt.*.>")),
            (f"$JS.API.CONSUMER.CREATE.{EVENTS_STREAM}.{mine}", create(mine, "evt.beta.>")),
            (f"$JS.API.CONSUMER.CREATE.{EVENTS_STREAM}", create(mine, "evt.beta.>")),
            # another consumer: a site's durable, updated to its filter or pulled from
            (create_subject("launch-beta", "alpha"), create("launch-beta", "evt.alpha.>")),
            (f"$JS.API.CONSUMER.MSG.NEXT.{EVENTS_STREAM}.launch-beta", b'{"batch": 1}'),
            (f"$JS.API.CONSUMER.DELETE.{EVENTS_STREAM}.projector", b""),
            (f"$JS.API.CONSUMER.INFO.{EVENTS_STREAM}.controller", b""),
            (f"$JS.API.CONSUMER.LIST.{EVENTS_STREAM}", b"{}"),
            # reads of the stream outside a consumer
            (f"$JS.API.DIRECT.GET.{EVENTS_STREAM}", b'{"seq": 1}'),
            (f"$JS.API.DIRECT.GET.{EVENTS_STREAM}.evt.beta.>", b""),
            (f"$JS.API.STREAM.MSG.GET.{EVENTS_STREAM}", b'{"seq": 1}'),
            ("$JS.API.INFO", b""),
        ]
        for stream in (EVENTS_STREAM, HB_STREAM, HB_IN_STREAM):  # stream administration
            for verb in ("INFO", "UPDATE", "DELETE", "PURGE", "MSG.DELETE", "SNAPSHOT"):
                denied.append((f"$JS.API.STREAM.{verb}.{stream}", b"{}"))
        denied += [("$JS.API.STREAM.CREATE.EVIL", b'{"name":"EVIL"}'), ("$JS.API.STREAM.LIST", b"")]
        for subject, payload in denied:
            verdict = await try_publish(nc, v, subject, payload)
            assert verdict.refused, f"{subject} allowed: {verdict.answer}"
        for subject in ("evt.>", "evt.alpha.>", "hb.>", "_INBOX_beta.>", "_INBOX.>", ">"):
            assert (await try_subscribe(nc, v, subject)).refused, subject


async def test_a_push_consumer_aimed_elsewhere_delivers_nothing_there(
    secure_nats: SecureNats, js: JetStreamContext
) -> None:
    """The create body is not the permissions' to judge: a push ``deliver_subject`` is
    accepted. What it could reach is shown here to get nothing (the log's own subjects are
    refused as a cycle by the server; elsewhere nothing is delivered)."""
    await append_jobs(js, "alpha", 1)
    credential = monitor_for(secure_nats, ["alpha"])
    name = consumer_names(credential.public_key)[0]
    heard: list[str] = []

    async def listen(msg: object) -> None:
        heard.append(str(getattr(msg, "subject", "")))

    await js._nc.subscribe("hb.beta.>", cb=listen)
    v = Violations()
    async with monitor_connection(secure_nats, credential, v) as nc:
        for target in ("hb.beta.x", "evt.beta.job.x.created"):
            body = create(name, "evt.alpha.>", deliver_subject=target)
            verdict = await try_publish(nc, v, create_subject(name, "alpha"), body)
            assert not verdict.refused
            await asyncio.sleep(0.5)
            await try_publish(nc, v, f"$JS.API.CONSUMER.DELETE.{EVENTS_STREAM}.{name}")
    assert heard == []
    assert (await js.stream_info(HB_IN_STREAM)).state.messages == 0
