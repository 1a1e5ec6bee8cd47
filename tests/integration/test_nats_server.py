"""The nats-server wrapper against real processes: start, persist, reload, fail, cluster."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import APIError as JsApiError
from nats.js.errors import NoStreamResponseError

from lodestream.eventlog.streams import ensure_streams
from lodestream.infra.nats.cluster import cluster_configs
from lodestream.infra.nats.config import NatsServerConfig
from lodestream.infra.nats.errors import ReloadError, ServerStartError
from lodestream.infra.nats.server import NatsServer
from lodestream.natsconn import connect
from lodestream.schemas.nkey import new_user_seed, user_public_key
from lodestream.schemas.subjects import EVENTS_STREAM, HB_IN_STREAM, HB_STREAM
from tests.fixtures.nats import RunningNats, SecureNats, connect_site, write_seed
from tests.fixtures.ports import free_port


async def test_server_serves_jetstream_streams(js: JetStreamContext) -> None:
    events = await js.stream_info(EVENTS_STREAM)
    heartbeats = await js.stream_info(HB_STREAM)
    assert events.config.subjects == ["evt.>"]
    assert not heartbeats.config.subjects  # HB only sources HBIN, where launchers publish
    inbox = await js.stream_info(HB_IN_STREAM)
    assert inbox.config.subjects == ["hb.>"]
    assert inbox.config.allow_rollup_hdrs is False
    ack = await js.publish(f"evt.local.job.{uuid.uuid4()}.created", b"{}")
    assert ack.stream == EVENTS_STREAM


@pytest.mark.parametrize("how", ["stop", "kill"])
async def test_restart_on_same_store_keeps_messages(nats_server: RunningNats, how: str) -> None:
    subjects = [f"evt.local.job.{uuid.uuid4()}.created" for _ in range(3)]
    nc = await connect(nats_server.settings())
    js = nc.jetstream()
    await ensure_streams(js)
    for subject in subjects:
        await js.publish(subject, subject.encode())
    await nc.close()

    old_pid = nats_server.server.pid
    getattr(nats_server.server, how)()
    assert not nats_server.server.running
    nats_server.server.start()
    assert nats_server.server.pid != old_pid

    nc = await connect(nats_server.settings())
    try:
        js = nc.jetstream()
        info = await js.stream_info(EVENTS_STREAM)
        assert info.state.messages == 3
        for seq, subject in enumerate(subjects, start=1):
            msg = await js.get_msg(EVENTS_STREAM, seq)
            assert msg.subject == subject
            assert msg.data == subject.encode()
    finally:
        await nc.close()


async def test_reload_adds_and_revokes_sites_without_restart(
    secure_nats: SecureNats, tmp_path: Path
) -> None:
    gamma_seed = new_user_seed()
    secure_nats.seed_files["gamma"] = write_seed(tmp_path / "gamma.nk", gamma_seed)
    with pytest.raises(NatsError, match="Authorization Violation"):
        await connect_site(secure_nats, "gamma")

    beta_closed = asyncio.Event()

    async def on_beta_closed() -> None:
        beta_closed.set()

    beta = await connect_site(secure_nats, "beta", closed_cb=on_beta_closed)
    pid = secure_nats.server.pid

    secure_nats.set_sites(
        {"alpha": secure_nats.public_keys["alpha"], "gamma": user_public_key(gamma_seed)}
    )
    assert secure_nats.server.pid == pid

    gamma = await connect_site(secure_nats, "gamma")
    try:
        await gamma.publish("hb.gamma.s1", b"")
        await gamma.flush()
    finally:
        await gamma.close()

    await asyncio.wait_for(beta_closed.wait(), 10)
    assert beta.is_closed
    with pytest.raises(NatsError, match="Authorization Violation"):
        await connect_site(secure_nats, "beta")


async def test_refused_reload_keeps_the_running_config(secure_nats: SecureNats) -> None:
    server = secure_nats.server
    good = server.config
    broken = dataclasses.replace(good, authorization='authorization { users = [{nkey: "UBAD"}] }')
    with pytest.raises(ReloadError, match="refused"):
        server.reload(broken)
    assert server.running
    assert server.config == good
    # Still serving the old users, and the file on disk is the one it runs on.
    alpha = await connect_site(secure_nats, "alpha")
    await alpha.close()
    server.reload()


def test_start_failure_reports_the_log(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = NatsServerConfig("busy", tmp_path / "store", port, http_port=free_port())
        server = NatsServer(config, tmp_path / "nats")
        with pytest.raises(ServerStartError, match="address already in use"):
            server.start()
    assert not server.running


def test_context_manager_stops_the_process(tmp_path: Path) -> None:
    config = NatsServerConfig("ctx", tmp_path / "store", free_port())
    with NatsServer(config, tmp_path / "nats") as server:
        assert server.running
        assert server.client_url == f"nats://127.0.0.1:{config.client_port}"
    assert not server.running
    assert (tmp_path / "nats" / "nats-server.conf").stat().st_mode & 0o777 == 0o600


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[NatsServer]]:
    configs = cluster_configs(
        store_root=tmp_path / "store",
        client_ports=[free_port() for _ in range(3)],
        cluster_ports=[free_port() for _ in range(3)],
        http_ports=[free_port() for _ in range(3)],
    )
    servers = [NatsServer(cfg, tmp_path / cfg.server_name) for cfg in configs]
    try:
        for server in servers:
            server.start(wait=False)
        for server in servers:
            server.wait_ready(30, js_enabled_only=False)
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.mark.slow  # fault injection: waits for leader elections after a node is killed
async def test_three_node_cluster_survives_losing_a_node(cluster: list[NatsServer]) -> None:
    urls = [server.client_url for server in cluster]
    nc = await nats.connect(servers=urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    try:
        js = nc.jetstream(timeout=10)
        await ensure_streams(js, replicas=3)
        info = await js.stream_info(EVENTS_STREAM)
        assert info.config.num_replicas == 3
        first = await _publish_until_acked(js, "evt.local.job.a.created", b"1")

        cluster[0].kill()
        second = await _publish_until_acked(js, "evt.local.job.b.created", b"2")
        assert second.seq == first.seq + 1
        assert (await js.get_msg(EVENTS_STREAM, first.seq)).data == b"1"

    finally:
        await nc.close()


async def _publish_until_acked(js: JetStreamContext, subject: str, data: bytes) -> PubAck:
    """Retry through leader elections; the message id makes retries free, as in production.

    Right after creation or a node loss, an R3 stream has no leader for a moment: the
    publish then gets no responders (503) or no answer at all.
    """
    headers = {"Nats-Msg-Id": str(uuid.uuid4())}
    for _ in range(40):
        try:
            return await js.publish(subject, data, headers=headers, timeout=2)
        except (TimeoutError, NoRespondersError, NoStreamResponseError, JsApiError):
            await asyncio.sleep(0.25)
    raise AssertionError(f"no PubAck for {subject} after the failover")
