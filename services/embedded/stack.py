"""``lode up``: nats-server, Postgres, migrations, streams, api, projector, controller.

The stack is a set of real processes — the same binaries and services an
operator runs at scale — started from a state directory that a second
``lode up`` reuses without losing data. Once started, every one of them is
supervised (:mod:`lodestream.services.embedded.supervisor`): restarted with a backoff
when it dies, nats-server and Postgres included. Each service connects to
Postgres with its own role (:mod:`lodestream.infra.postgres.roles`).
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import re
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pydantic import SecretStr

from lodestream.eventlog import ensure_streams
from lodestream.eventlog.jetstream import jetstream
from lodestream.infra.nats.auth import CONTROL_USER, render_authorization
from lodestream.infra.nats.config import NatsServerConfig
from lodestream.infra.nats.server import NatsServer
from lodestream.infra.nats.tls import TlsFiles, ensure_local_ca
from lodestream.infra.postgres import migrate
from lodestream.infra.postgres.roles import SERVICE_ROLES, apply_roles
from lodestream.infra.postgres.server import EmbeddedPostgres
from lodestream.natsconn import connect
from lodestream.services.embedded.credentials import CredentialSync
from lodestream.services.embedded.errors import StackError
from lodestream.services.embedded.process import ServiceProcess
from lodestream.services.embedded.state import (
    DATABASE_URLS,
    ROLE_NAMES,
    StackRole,
    StackSecrets,
    StateDir,
)
from lodestream.services.embedded.supervisor import Supervised, Supervisor
from lodestream.settings import NatsSettings

log = logging.getLogger(__name__)
DATABASE: Final = "lodestream"
# name, module, and the Postgres role it connects as
SERVICES: Final[tuple[tuple[str, str, StackRole], ...]] = (
    ("projector", "lodestream.services.projector", "projector"),
    ("controller", "lodestream.services.controller", "controller"),
    ("api", "lodestream.services.api", "api"),
)

__all__ = [
    "DATABASE",
    "EmbeddedStack",
    "StackError",
    "StackInfo",
    "StackPorts",
    "grant_stack_roles",
]


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
    # database_url above is the superuser's (administration); the services use these.
    database_urls: dict[StackRole, str]


def grant_stack_roles(state_dir: Path, database_url: str) -> bool:
    """Re-apply the service roles if ``database_url`` is this stack's superuser URL.

    For ``lode migrate`` on an embedded stack: tables a migration adds belong to
    the superuser until the grants are applied (``lode up`` applies them too).
    """
    state = StateDir(state_dir.absolute())
    urls = state.read_json(state.env_file).get(DATABASE_URLS)
    if not isinstance(urls, dict) or urls.get("admin") != database_url:
        return False
    passwords = state.secrets().postgres
    apply_roles(database_url, DATABASE, {role: passwords[role] for role in SERVICE_ROLES})
    return True


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
        self.supervisor: Supervisor | None = None
        self._status: dict[str, Any] | None = None

    def start(self, user: str | None = None) -> StackInfo:
        self.state.create()
        secrets = self.state.secrets()
        password = secrets.control_password
        tls = ensure_local_ca(self.state.tls)
        self.nats = self._start_nats(password, tls)
        urls = self._start_postgres(secrets)
        nats_settings = NatsSettings(
            url=self.nats.client_url, user=CONTROL_USER, password=SecretStr(password)
        )
        asyncio.run(_ensure_streams(nats_settings))

        env = {
            "LODE_NATS_URL": self.nats.client_url,
            "LODE_NATS__USER": CONTROL_USER,
            "LODE_NATS__PASSWORD": password,
            "LODE_API__HOST": "127.0.0.1",
            "LODE_API__PORT": str(self.ports.api),
        }
        # Lets `lode projector rebuild`, `lode user create`… find this stack without flags.
        self.state.write_private_json(self.state.env_file, {**env, DATABASE_URLS: urls})
        api_url = self._start_services(env, urls)
        # What `lode site init` needs to point a new site at this stack.
        self.state.write_private_json(
            self.state.root / "sites.json",
            {"websocket_url": self.nats.websocket_url, "ca_file": str(tls.ca_cert),
             "api_url": api_url},
        )  # fmt: skip
        # lode up reads rm.sites with the read-only role the controller has.
        self._start_supervision(
            CredentialSync(self.nats, urls["controller"], CONTROL_USER, password)
        )
        user, token = self._local_user(urls["api"], user or default_user(), api_url)
        self.write_status()
        return StackInfo(
            api_url=api_url,
            nats_url=self.nats.client_url,
            websocket_url=self.nats.websocket_url,
            database_url=urls["admin"],
            ca_file=tls.ca_cert,
            user=user,
            token=token,
            control_user=CONTROL_USER,
            control_password=password,
            state_dir=self.state.root,
            database_urls=urls,
        )

    def supervised(self) -> Iterator[tuple[str, Supervised]]:
        """Every process this stack started, by name, in the order they are checked."""
        if self.postgres is not None:
            yield "postgres", self.postgres
        if self.nats is not None:
            yield "nats-server", self.nats
        for service in self.services:
            yield service.name, service

    def supervise_once(self) -> None:
        """Restart what died (with backoff); apply site credential changes to nats-server."""
        if self.supervisor is not None:
            self.supervisor.step()

    def supervise(self, stop: threading.Event, interval_s: float = 1.0) -> None:
        """Supervise until ``stop`` is set (``lode up`` runs this in a thread)."""
        if self.supervisor is None:
            stop.wait()  # not started: nothing to supervise
            return
        self.supervisor.run(stop, interval_s)

    def status(self) -> dict[str, Any]:
        """Pids, restarts and errors of the supervised processes, and the credential sync."""
        status: dict[str, Any] = {}
        if self.supervisor is not None:
            status.update(self.supervisor.status(self.supervised()))
        if self.credentials is not None:
            status["credentials"] = self.credentials.status()
        return status

    def write_status(self) -> None:
        """``status.json`` in the state dir, rewritten only when something changed."""
        status = self.status()
        if status != self._status:
            self.state.write_private_json(self.state.status_file, status)
            self._status = status

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

    def _start_services(self, env: dict[str, str], urls: dict[StackRole, str]) -> str:
        """Start the services, each with its own Postgres role; the API's URL once it answers."""
        self.services = [
            ServiceProcess(
                name,
                [sys.executable, "-m", module],
                {**env, "LODE_DATABASE_URL": urls[role]},
                self.state.logs / f"{name}.log",
            )
            for name, module, role in SERVICES
        ]
        for service in self.services:
            service.start()
        api_url = f"http://127.0.0.1:{self.ports.api}"
        self._wait_http(f"{api_url}/healthz", self.services[-1])
        return api_url

    def _start_supervision(self, credentials: CredentialSync) -> None:
        credentials.sync_once()  # sites registered in an earlier run may connect again
        self.credentials = credentials
        self.supervisor = Supervisor(
            self.supervised,
            [("credential sync", credentials.sync_once), ("status file", self.write_status)],
            on_restart={"nats-server": credentials.invalidate},
        )

    def _start_nats(self, password: str, tls: TlsFiles) -> NatsServer:
        # No site keys yet: the credential sync adds them once Postgres is up.
        nats = NatsServer(
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
        nats.start()
        return nats

    def _start_postgres(self, secrets: StackSecrets) -> dict[StackRole, str]:
        """Start Postgres, migrate, grant; the URL of each role (``admin``: the superuser)."""
        self.postgres = EmbeddedPostgres(
            self.state.pg_data, self.ports.postgres, password=secrets.postgres_password("admin")
        )
        self.postgres.ensure_initialized()
        self.postgres.start()  # upgrades a cluster an older `lode up` left on trust auth
        self.postgres.create_database(DATABASE)
        admin_url = self.postgres.url(DATABASE)
        migrate.upgrade(admin_url)
        apply_roles(admin_url, DATABASE, {role: secrets.postgres[role] for role in SERVICE_ROLES})
        return {
            role: self.postgres.url(DATABASE, user=name, password=secrets.postgres_password(role))
            for role, name in ROLE_NAMES.items()
        }

    def _local_user(self, database_url: str, user: str, api_url: str) -> tuple[str, str]:
        from lodestream.services.api.users import create_user  # noqa: PLC0415 - keeps FastAPI out of import

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
