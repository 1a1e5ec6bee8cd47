"""A leaf-node site for tests: its nats-server, linked to a stack's hub through a cuttable proxy.

The leaf's link to the hub goes through a :class:`CutProxy`, so a test cuts the WAN alone:
the site's agent and pilots stay connected to their leaf, the control plane to the hub.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from lodestream.agents.site.settings import SiteSettings
from lodestream.eventlog.outbox import OUTBOX_STREAM
from lodestream.infra.nats.auth import site_inbox_prefix
from lodestream.infra.nats.leaf import HUB_DOMAIN, leaf_config
from lodestream.infra.nats.server import NatsServer
from lodestream.infra.nats.tls import ensure_local_ca
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.schemas.topology import LAUNCH
from tests.fixtures.ports import free_port
from tests.support.processes import terminate
from tests.support.proxy import CutProxy
from tests.support.site import make_site_dir
from tests.support.stack import Stack, kill_group


@dataclass
class LeafSite:
    stack: Stack
    site: str
    server: NatsServer
    proxy: CutProxy
    settings: SiteSettings
    processes: dict[str, subprocess.Popen[bytes]]

    def start(self, name: str, *argv: str) -> subprocess.Popen[bytes]:
        """``lode <argv> <site dir>`` as a child process logging to ``<name>.log``."""
        cli = [sys.executable, "-m", "lodestream.client.cli.main"]
        with self.stack.log_path(name).open("ab") as log:
            proc = subprocess.Popen(
                [*cli, *argv], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.processes[name] = proc
        return proc

    def agent(self) -> subprocess.Popen[bytes]:
        return self.start("agent", "site", "start", str(self.settings.directory))

    def pilot(self, name: str) -> subprocess.Popen[bytes]:
        return self.start(
            name, "launcher", "--site", str(self.settings.directory), "--wall-time-min", "10"
        )

    async def outbox_size(self) -> int:
        """Events the leaf keeps for the hub (a work queue: forwarded ones are gone)."""
        async with self.connection() as nc:
            try:
                info = await nc.jetstream().stream_info(OUTBOX_STREAM)
            except NotFoundError:
                return 0
            return info.state.messages

    async def linked(self, timeout_s: float = 30.0) -> None:
        """Wait until the hub's JetStream answers through the leaf."""
        async with self.connection() as nc, asyncio.timeout(timeout_s):
            while True:
                try:
                    # A read the site's key may make: its pilots' consumer.
                    await nc.jetstream(domain=HUB_DOMAIN).consumer_info(
                        EVENTS_STREAM, LAUNCH.durable(self.site)
                    )
                except (nats.errors.Error, TimeoutError):
                    await asyncio.sleep(0.1)
                else:
                    return

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Client]:
        """A connection to the leaf as the site, as its own processes connect."""
        assert self.settings.ca_path is not None
        nc = await nats.connect(
            servers=[self.server.websocket_url],
            tls=ssl.create_default_context(cafile=str(self.settings.ca_path)),
            nkeys_seed=str(self.settings.seed_path),
            inbox_prefix=site_inbox_prefix(self.site),
        )
        try:
            yield nc
        finally:
            await nc.close()


@contextlib.asynccontextmanager
async def leaf_site(stack: Stack, site: str, **launcher: Any) -> AsyncIterator[LeafSite]:
    """``site``'s leaf node, linked to ``stack``'s websocket listener through a proxy, and a
    site directory whose processes connect to the leaf."""
    root = stack.root / f"leaf-{site}"
    tls = ensure_local_ca(root / "tls")  # the site's own CA, for its leaf's listener
    hub_port = stack.nats.config.websocket_port
    assert hub_port is not None
    async with CutProxy(hub_port) as proxy:
        server = NatsServer(
            leaf_config(
                site, hub_urls=[f"wss://127.0.0.1:{proxy.port}"],
                seed=stack.seed_files[site].read_text().strip(),
                site_public_key=stack.public_keys[site], hub_ca_file=stack.ca_file,
                store_dir=root / "store", client_port=free_port(), websocket_port=free_port(),
                tls=tls,
            ),
            root / "nats",
        )  # fmt: skip
        server.start()
        settings = make_site_dir(
            root / "dir", site, wss_url=server.websocket_url, ca_file=tls.ca_cert,
            seed_file=stack.seed_files[site], nats={"hub_domain": HUB_DOMAIN}, **launcher,
        )  # fmt: skip
        leaf = LeafSite(stack, site, server, proxy, settings, {})
        try:
            await leaf.linked()  # the site's agent publishes its apps to the hub at start
            yield leaf
        finally:
            # In a thread: the proxy forwards on this loop, and a pilot that stops closes its
            # session at the hub through it. Stopped here, it waited out its timeouts.
            await asyncio.to_thread(_stop_all, list(leaf.processes.values()))
            server.stop()


def _stop_all(processes: list[subprocess.Popen[bytes]]) -> None:
    for proc in processes:
        terminate(proc)
        kill_group(proc)


async def job_events(js: JetStreamContext, site: str) -> dict[str, list[tuple[int, str, str]]]:
    """Every job event of ``site`` on the hub's log: job id -> [(seq, type, Nats-Msg-Id)]."""
    out: dict[str, list[tuple[int, str, str]]] = {}
    info = await js.stream_info(EVENTS_STREAM)
    last = info.state.last_seq
    if last == 0:
        return out
    sub = await js.subscribe(f"evt.{site}.job.>", ordered_consumer=True)
    try:
        while True:
            msg = await sub.next_msg(timeout=5)
            _, _, _, job, name = msg.subject.split(".")
            seq = msg.metadata.sequence.stream
            out.setdefault(job, []).append(
                (seq, f"job.{name}", (msg.headers or {}).get("Nats-Msg-Id", ""))
            )
            if msg.metadata.num_pending == 0:
                return out
    finally:
        await sub.unsubscribe()
