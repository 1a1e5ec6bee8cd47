"""The nats-server configuration of lodestream, rendered from one dataclass.

One renderer serves the embedded single node, the test fixtures and the
3-node cluster (:mod:`lodestream.infra.nats.cluster`), so what the tests exercise is
what an operator runs. Listeners bind to loopback by default: the plain
client port is for the control-plane services on the same host; sites and
launchers come in through the websocket listener, which always has TLS
(``no_tls`` is never rendered, and a websocket without TLS files is refused).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from lodestream.infra.nats.tls import TlsFiles

MIB: Final = 1024 * 1024
GIB: Final = 1024 * MIB

HEADER: Final = (
    "# nats-server configuration for lodestream, rendered by infra/nats/config.py.\n"
    "# Edit the settings it is rendered from, not this file: it is rewritten on start.\n"
)


@dataclass(frozen=True, slots=True)
class ClusterBlock:
    """Route listener and peers of one node of a JetStream cluster."""

    name: str
    port: int
    routes: tuple[str, ...]
    # Clients learn the other nodes' addresses from INFO unless this is set. Behind NAT or
    # published container ports those addresses are not reachable: the clients then list
    # every node in their URL instead (NATS_URL takes a comma-separated list).
    no_advertise: bool = False


@dataclass(frozen=True, slots=True)
class LeafRemote:
    """The outbound link of a site's leaf node to the hub (:mod:`lodestream.infra.nats.leaf`).

    It dials the hub's ``wss://`` listener, like every site process, and signs in with the
    site's nkey: the seed is written into the leaf's config (mode 0600), which stays at the
    site.
    """

    urls: tuple[str, ...]
    seed: str
    ca_file: Path | None = None
    reconnect_s: float = 1.0  # how soon after a cut heals the leaf is back


@dataclass(frozen=True, slots=True)
class NatsServerConfig:
    server_name: str
    store_dir: Path
    client_port: int
    host: str = "127.0.0.1"
    websocket_port: int | None = None
    http_port: int | None = None
    tls: TlsFiles | None = None
    authorization: str | None = None
    jetstream_max_memory: int = 256 * MIB
    jetstream_max_file: int = 10 * GIB
    cluster: ClusterBlock | None = None
    # A JetStream domain names this server's JetStream for clients of a leaf node: the hub's
    # (``hub``) when sites run leaf nodes, and each leaf's own (its site's name).
    jetstream_domain: str | None = None
    # The hub accepts leaf nodes (they arrive on the websocket listener; this port, bound to
    # ``host``, is what nats-server needs to turn leaf connections on).
    leafnode_port: int | None = None
    leaf_remote: LeafRemote | None = None

    def __post_init__(self) -> None:
        if self.websocket_port is not None and self.tls is None:
            raise ValueError("the websocket listener needs TLS files: sites never connect in clear")


def host_port(host: str, port: int) -> str:
    """``host:port`` with IPv6 literals bracketed, as nats-server's listeners expect."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def render_config(cfg: NatsServerConfig) -> str:
    """The complete config file text; identical input gives identical output."""
    blocks = [
        HEADER,
        f"server_name: {_q(cfg.server_name)}\nlisten: {_q(host_port(cfg.host, cfg.client_port))}\n",
    ]
    if cfg.http_port is not None:
        blocks.append(
            "# monitoring (/healthz, /varz) for readiness probes; loopback only\n"
            f"http: {_q(host_port(cfg.host, cfg.http_port))}\n"
        )
    blocks.append(
        "jetstream {\n"
        f"  store_dir: {_q(str(cfg.store_dir))}\n"
        f"  max_memory_store: {cfg.jetstream_max_memory}\n"
        f"  max_file_store: {cfg.jetstream_max_file}\n"
        + (f"  domain: {_q(cfg.jetstream_domain)}\n" if cfg.jetstream_domain else "")
        + "}\n"
    )
    if cfg.websocket_port is not None:
        assert cfg.tls is not None  # enforced by NatsServerConfig
        blocks.append(_websocket(cfg.host, cfg.websocket_port, cfg.tls))
    if cfg.cluster is not None:
        blocks.append(_cluster(cfg.host, cfg.cluster))
    if cfg.leafnode_port is not None or cfg.leaf_remote is not None:
        blocks.append(_leafnodes(cfg.host, cfg.leafnode_port, cfg.leaf_remote))
    if cfg.authorization is not None:
        blocks.append(cfg.authorization)
    return "\n".join(blocks)


def _websocket(host: str, port: int, tls: TlsFiles) -> str:
    # Compression is off: event payloads are small JSON and TLS already costs CPU per frame.
    return (
        "# sites and launchers: outbound wss:// only, authenticated by nkey\n"
        "websocket {\n"
        f"  listen: {_q(host_port(host, port))}\n"
        "  tls {\n"
        f"    cert_file: {_q(str(tls.server_cert))}\n"
        f"    key_file: {_q(str(tls.server_key))}\n"
        "  }\n"
        "  compression: false\n"
        "}\n"
    )


def _leafnodes(host: str, port: int | None, remote: LeafRemote | None) -> str:
    lines = ["leafnodes {"]
    if port is not None:
        lines.append(f"  listen: {_q(host_port(host, port))}")
    if remote is not None:
        urls = ", ".join(_q(url) for url in remote.urls)
        lines += [f"  reconnect: {_q(f'{remote.reconnect_s:g}s')}", "  remotes: [", "    {",
                  f"      urls: [{urls}]", f"      nkey: {_q(remote.seed)}"]  # fmt: skip
        if remote.ca_file is not None:
            lines.append(f"      tls {{ ca_file: {_q(str(remote.ca_file))} }}")
        lines += ["    }", "  ]"]
    return "\n".join([*lines, "}"]) + "\n"


def _cluster(host: str, cluster: ClusterBlock) -> str:
    routes = "".join(f"    {_q(route)}\n" for route in cluster.routes)
    return (
        "cluster {\n"
        f"  name: {_q(cluster.name)}\n"
        f"  listen: {_q(host_port(host, cluster.port))}\n"
        f"  routes: [\n{routes}  ]\n"
        + ("  no_advertise: true\n" if cluster.no_advertise else "")
        + "}\n"
    )


def _q(value: str) -> str:
    return json.dumps(value)
