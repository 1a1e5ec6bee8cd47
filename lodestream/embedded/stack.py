"""``lode up``: nats-server, Postgres, migrations, streams, api, projector, controller.

The stack is a set of real processes — the same binaries and services an
operator runs at scale — started from a state directory that a second
``lode up`` reuses without losing data.
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import re
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from infra.nats.auth import CONTROL_USER, new_password, render_authorization
from infra.nats.config import NatsServerConfig
from infra.nats.server import NatsServer
from infra.nats.tls import ensure_local_ca
from infra.postgres import migrate
from infra.postgres.server import EmbeddedPostgres
from lodestream.embedded.credentials import CredentialSync
from lodestream.embedded.process import ServiceProcess
from lodestream.embedded.state import StateDir
from lodestream.eventlog import ensure_streams
from lodestream.eventlog.jetstream import jetstream
from lodestream.natsconn import connect
from lodestream.settings import NatsSettings

log = logging.getLogger(__name__)
DATABASE = "lodestream"


class StackError(RuntimeError):
    """The embedded stack could not start; the message says which part and why."""


@dataclass(frozen=True, slots=True)
class StackPorts:
    nats: int = 14222
    websocket: int = 14443
    nats_http: int = 18222
    postgres: int = 15432
    api: int = 8400


@dataclass(frozen=True, slots=True)
class StackInfo:
    api_url: str
    nats_url: str
    websocket_url: str
    database_url: str
    ca_file: Path
    user: str
    token: str
    control_user: str
    control_password: str
    state_dir: Path


def default_user() -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", getpass.getuser())[:64]
    return name or "scientist"


class EmbeddedStack:
    def __init__(self, state_dir: Path, ports: StackPorts | None = None) -> None:
        self.state = StateDir(state_dir.absolute())
        self.ports = ports or StackPorts()
        self.nats: NatsServer | None = None
        self.postgres: EmbeddedPostgres | None = None
        self.services: list[ServiceProcess] = []
        self.credentials: CredentialSync | None = None

    def start(self, user: str | None = None) -> StackInfo:
        self.state.create()
        secrets = self.state.read_json(self.state.secrets_file)
        if "control_password" not in secrets:
            secrets["control_password"] = new_password()
            self.state.write_private_json(self.state.secrets_file, secrets)
        password = str(secrets["control_password"])
        tls = ensure_local_ca(self.state.tls)

        self.nats = NatsServer(
            NatsServerConfig(
                server_name="lode-embedded",
                store_dir=self.state.jetstream,
                client_port=self.ports.nats,
                websocket_port=self.ports.websocket,
                http_port=self.ports.nats_http,
                tls=tls,
                authorization=render_authorization(CONTROL_USER, password, {}),
            ),
            self.state.nats,
        )
        self.nats.start()
        self.postgres = EmbeddedPostgres(self.state.pg_data, self.ports.postgres)
        self.postgres.ensure_initialized()
        self.postgres.start()
        self.postgres.create_database(DATABASE)
        database_url = self.postgres.url(DATABASE)
        migrate.upgrade(database_url)

        nats_settings = NatsSettings(
            url=self.nats.client_url,
            user=CONTROL_USER,
            password=SecretStr(password),
        )
        asyncio.run(_ensure_streams(nats_settings))

        env = {
            "LODE_NATS_URL": self.nats.client_url,
            "LODE_NATS__USER": CONTROL_USER,
            "LODE_NATS__PASSWORD": password,
            "LODE_DATABASE_URL": database_url,
            "LODE_API__HOST": "127.0.0.1",
            "LODE_API__PORT": str(self.ports.api),
        }
        # Lets `lode projector rebuild`, `lode user create`… find this stack without flags.
        self.state.write_private_json(self.state.env_file, env)
        # Lets `lode projector rebuild`, `lode user create`… find this stack without flags.
        self.state.write_private_json(self.state.env_file, env)
        self.services = [
            ServiceProcess(
                name, [sys.executable, "-m", module], env, self.state.logs / f"{name}.log"
            )
            for name, module in (
                ("projector", "services.projector"),
                ("controller", "services.controller"),
                ("api", "services.api"),
            )
        ]
        for service in self.services:
            service.start()
        api_url = f"http://127.0.0.1:{self.ports.api}"
        self._wait_http(f"{api_url}/healthz", self.services[-1])

        # What `lode site init` needs to point a new site at this stack.
        self.state.write_private_json(
            self.state.root / "sites.json",
            {"websocket_url": self.nats.websocket_url, "ca_file": str(tls.ca_cert),
             "api_url": api_url},
        )  # fmt: skip
        self.credentials = CredentialSync(self.nats, database_url, CONTROL_USER, password)
        self.credentials.sync_once()  # sites registered in an earlier run may connect again
        user, token = self._local_user(database_url, user or default_user(), api_url)
        return StackInfo(
            api_url=api_url,
            nats_url=self.nats.client_url,
            websocket_url=self.nats.websocket_url,
            database_url=database_url,
            ca_file=tls.ca_cert,
            user=user,
            token=token,
            control_user=CONTROL_USER,
            control_password=password,
            state_dir=self.state.root,
        )

    def supervise_once(self) -> None:
        """Restart any service that died; apply site credential changes to nats-server."""
        for service in self.services:
            service.ensure_running()
        if self.credentials is not None:
            self.credentials.sync_once()

    def stop(self) -> None:
        for service in reversed(self.services):
            service.stop()
        self.services = []
        if self.postgres is not None:
            self.postgres.stop()
            self.postgres = None
        if self.nats is not None:
            self.nats.stop()
            self.nats = None

    def _local_user(self, database_url: str, user: str, api_url: str) -> tuple[str, str]:
        from services.api.users import create_user  # noqa: PLC0415 - keeps FastAPI out of import

        client = self.state.read_json(self.state.client_file)
        if client.get("token") and client.get("user"):
            return str(client["user"]), str(client["token"])
        token = create_user(database_url, user)
        self.state.write_private_json(
            self.state.client_file, {"api_url": api_url, "user": user, "token": token}
        )
        return user, token

    def _wait_http(self, url: str, service: ServiceProcess, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not service.running:
                raise StackError(f"{service.name} exited during start:\n{service.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        raise StackError(f"{service.name} not healthy at {url} after {timeout_s:.0f}s")


async def _ensure_streams(settings: NatsSettings) -> None:
    nc = await connect(settings)
    try:
        await ensure_streams(jetstream(nc))
    finally:
        await nc.close()
