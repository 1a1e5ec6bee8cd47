"""A 3-node JetStream cluster: the documented way out of the single embedded server.

With three nodes, ``ensure_streams(js, replicas=3)`` gives R3 streams that
survive the loss of any one node (docs/architecture.md §2). The configs use the
same renderer as the single node; only the ``cluster`` block is added. On
one machine the nodes differ by port (what the scale-out test runs); on
three hosts, pass each host's address in ``route_hosts`` and render one
config per host.

``python -m lodestream.infra.nats.cluster DIR`` writes the example configs shipped in
``infra/nats/examples/cluster/`` (a test checks that they are current).
Route connections are not authenticated here: on loopback, or on a private
network between the nodes, that is the usual layout; add a cluster
``authorization`` block before exposing route ports anywhere else.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from lodestream.infra.nats.config import ClusterBlock, NatsServerConfig, host_port, render_config
from lodestream.infra.nats.tls import TlsFiles

CLUSTER_NAME: Final = "lodestream"
# Ports of the shipped example; the tests use free ports instead.
EXAMPLE_CLIENT_PORTS: Final = (4222, 4223, 4224)
EXAMPLE_CLUSTER_PORTS: Final = (6222, 6223, 6224)
EXAMPLE_HTTP_PORTS: Final = (8222, 8223, 8224)
EXAMPLE_STORE: Final = Path("/var/lib/lodestream/nats")


def cluster_configs(
    n: int = 3,
    *,
    store_root: Path,
    client_ports: Sequence[int],
    cluster_ports: Sequence[int],
    http_ports: Sequence[int] | None = None,
    host: str = "127.0.0.1",
    route_hosts: Sequence[str] | None = None,
    cluster_name: str = CLUSTER_NAME,
    authorization: str | None = None,
    tls: TlsFiles | None = None,
    websocket_ports: Sequence[int] | None = None,
    no_advertise: bool = False,
) -> list[NatsServerConfig]:
    """One :class:`NatsServerConfig` per node, ``n1`` … ``nN``, each routing to all nodes.

    Every node lists every route, itself included (the server ignores a route
    to itself), so all nodes get the same routes block and any one can be
    restarted alone. JetStream needs an odd number of nodes for a quorum.
    """
    if n < 3 or n % 2 == 0:
        raise ValueError("a JetStream cluster needs an odd number of nodes, at least 3")
    route_hosts = route_hosts or [host] * n
    for name, seq in (
        ("client_ports", client_ports),
        ("cluster_ports", cluster_ports),
        ("http_ports", http_ports),
        ("route_hosts", route_hosts),
        ("websocket_ports", websocket_ports),
    ):
        if seq is not None and len(seq) != n:
            raise ValueError(f"{name} must have {n} entries, got {len(seq)}")
    routes = tuple(f"nats-route://{host_port(route_hosts[i], cluster_ports[i])}" for i in range(n))
    return [
        NatsServerConfig(
            server_name=f"n{i + 1}",
            store_dir=store_root / f"n{i + 1}",
            client_port=client_ports[i],
            host=host,
            http_port=http_ports[i] if http_ports is not None else None,
            websocket_port=websocket_ports[i] if websocket_ports is not None else None,
            tls=tls,
            authorization=authorization,
            cluster=ClusterBlock(
                name=cluster_name, port=cluster_ports[i], routes=routes, no_advertise=no_advertise
            ),
        )
        for i in range(n)
    ]


def render_cluster_configs(
    n: int = 3,
    *,
    store_root: Path,
    client_ports: Sequence[int],
    cluster_ports: Sequence[int],
    http_ports: Sequence[int] | None = None,
    host: str = "127.0.0.1",
    route_hosts: Sequence[str] | None = None,
    cluster_name: str = CLUSTER_NAME,
    authorization: str | None = None,
) -> list[str]:
    """The config file texts of :func:`cluster_configs`, one per node."""
    configs = cluster_configs(
        n,
        store_root=store_root,
        client_ports=client_ports,
        cluster_ports=cluster_ports,
        http_ports=http_ports,
        host=host,
        route_hosts=route_hosts,
        cluster_name=cluster_name,
        authorization=authorization,
    )
    return [render_config(cfg) for cfg in configs]


def example_configs() -> list[NatsServerConfig]:
    """The shipped example: three nodes on one host, the default ports shifted by one per node."""
    return cluster_configs(
        3,
        store_root=EXAMPLE_STORE,
        client_ports=EXAMPLE_CLIENT_PORTS,
        cluster_ports=EXAMPLE_CLUSTER_PORTS,
        http_ports=EXAMPLE_HTTP_PORTS,
    )


def write_examples(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for cfg in example_configs():
        path = directory / f"{cfg.server_name}.conf"
        path.write_text(render_config(cfg), encoding="utf-8")
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.stderr.write("usage: python -m lodestream.infra.nats.cluster DIR\n")
        return 2
    for path in write_examples(Path(args[0])):
        sys.stdout.write(f"wrote {path}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
