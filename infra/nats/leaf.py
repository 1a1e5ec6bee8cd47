"""A site's leaf node: its own nats-server, in its own JetStream domain, linked to the hub.

A site whose WAN link to the facility may drop runs this server on its login node; its
agent and pilots connect to it instead of the hub (``docs/architecture.md`` §11,
"Leaf-node sites"). The leaf:

* dials the hub's ``wss://`` listener with the site's nkey (:class:`LeafRemote`), so on
  the hub it is the site's key with the site's permissions and nothing more
  (:func:`lodestream.infra.nats.auth.leaf_grants`);
* has JetStream in the domain named after the site, which holds one stream, ``OUTBOX``
  (:mod:`lodestream.eventlog.outbox`): the events the hub could not take during a cut;
* serves the site's processes on a TLS websocket listener of its own, signed by the
  site's CA, for the site's key only.

``python -m lodestream.infra.nats.leaf DIR`` writes the shipped template
``infra/nats/examples/leaf/leaf.conf``; a site renders its own with :func:`leaf_config`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from lodestream.infra.nats.config import LeafRemote, NatsServerConfig, render_config
from lodestream.infra.nats.tls import TlsFiles
from lodestream.schemas.subjects import check_site

HUB_DOMAIN: Final = "hub"
"""The hub's JetStream domain when sites run leaf nodes (``NatsServerConfig.jetstream_domain``)."""

EXAMPLE_SEED: Final = "SU-THE-SITE-SEED-FROM-site.nk"
EXAMPLE_DIR: Final = Path("/var/lib/lodestream/leaf")


def leaf_authorization(site_public_key: str) -> str:
    """The leaf's own users: the site's key alone. Locally it may do anything (the leaf is
    the site's server); what reaches the hub is checked there against the site's grants."""
    return (
        "authorization {\n  users = [\n"
        f'    {{nkey: "{site_public_key}", '
        'allowed_connection_types: ["STANDARD", "WEBSOCKET"]}\n  ]\n}\n'
    )


def leaf_config(
    site: str,
    *,
    hub_urls: Sequence[str],
    seed: str,
    site_public_key: str,
    hub_ca_file: Path | None,
    store_dir: Path,
    client_port: int,
    websocket_port: int,
    tls: TlsFiles,
    host: str = "127.0.0.1",
) -> NatsServerConfig:
    """The config of ``site``'s leaf node; ``seed`` is the site's nkey seed (``site.nk``)."""
    return NatsServerConfig(
        server_name=f"leaf-{check_site(site)}",
        store_dir=store_dir,
        client_port=client_port,
        host=host,
        websocket_port=websocket_port,
        tls=tls,
        authorization=leaf_authorization(site_public_key),
        jetstream_domain=site,
        leaf_remote=LeafRemote(urls=tuple(hub_urls), seed=seed, ca_file=hub_ca_file),
    )


def example_config() -> NatsServerConfig:
    root = EXAMPLE_DIR
    return leaf_config(
        "alpha",
        hub_urls=["wss://hub.example.org:443"],
        seed=EXAMPLE_SEED,
        site_public_key="U-THE-SITE-PUBLIC-KEY",
        hub_ca_file=root / "hub-ca.pem",
        store_dir=root / "jetstream",
        client_port=4222,
        websocket_port=4443,
        tls=TlsFiles(root / "tls/ca.pem", root / "tls/server.pem", root / "tls/server-key.pem"),
        host="0.0.0.0",  # noqa: S104 - the site's pilots reach it from compute nodes
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.stderr.write("usage: python -m lodestream.infra.nats.leaf DIR\n")
        return 2
    path = Path(args[0]) / "leaf.conf"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_config(example_config()), encoding="utf-8")
    sys.stdout.write(f"wrote {path}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
