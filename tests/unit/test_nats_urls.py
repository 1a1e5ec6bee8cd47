"""NATS_URL: one server, or a cluster's nodes separated by commas."""

from __future__ import annotations

from pathlib import Path

import pytest

from lodestream.infra.nats.config import ClusterBlock, NatsServerConfig, render_config
from lodestream.natsconn import server_urls


def test_one_url_is_one_server() -> None:
    assert server_urls("nats://127.0.0.1:4222") == ["nats://127.0.0.1:4222"]


def test_a_cluster_is_listed_with_commas_and_spaces_do_not_matter() -> None:
    assert server_urls("wss://a:443, wss://b:443,wss://c:443,") == [
        "wss://a:443",
        "wss://b:443",
        "wss://c:443",
    ]


def test_an_empty_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        server_urls(" , ")


def test_no_advertise_is_rendered_only_when_asked() -> None:
    block = ClusterBlock(name="c", port=6222, routes=("nats-route://n1:6222",))
    cfg = NatsServerConfig(
        server_name="n1", store_dir=Path("/data"), client_port=4222, cluster=block
    )
    assert "no_advertise" not in render_config(cfg)
    quiet = ClusterBlock(name="c", port=6222, routes=block.routes, no_advertise=True)
    cfg = NatsServerConfig(
        server_name="n1", store_dir=Path("/data"), client_port=4222, cluster=quiet
    )
    assert "  no_advertise: true\n" in render_config(cfg)
