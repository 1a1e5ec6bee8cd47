"""A whole lodestream stack as real processes, for tests that attack it from the outside.

:func:`running_stack` starts nats-server (TLS websocket for sites, plain listener for the
control plane, one nkey per site), a fresh database of the session's Postgres, and the
projector, controller and API as ``python -m services.…`` child processes (the API served
by uvicorn on a free loopback port). It then does what an operator and the sites' owners
do: creates the users, registers each site with its public key over HTTP, and waits until
the controller has created the sites' work consumers.

Everything here is synchronous (child processes and ``httpx.Client``), so the stack can be
shared by many tests whatever their event loops; the few NATS calls of the setup run in a
worker thread with their own loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Coroutine, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

import httpx
import nats
from nats.js.errors import NotFoundError
from pydantic import SecretStr

from lodestream.eventlog.streams import ensure_streams
from lodestream.infra.nats.auth import CONTROL_USER, new_password, render_authorization
from lodestream.infra.nats.config import NatsServerConfig
from lodestream.infra.nats.leaf import HUB_DOMAIN
from lodestream.infra.nats.server import NatsServer
from lodestream.infra.nats.tls import ensure_local_ca
from lodestream.infra.postgres.server import EmbeddedPostgres
from lodestream.schemas.nkey import new_user_seed, user_public_key
from lodestream.schemas.subjects import EVENTS_STREAM
from lodestream.schemas.topology import SITE_CONSUMERS
from lodestream.services.api.users import create_user
from lodestream.settings import NatsSettings
from tests.fixtures.nats import write_seed
from tests.fixtures.ports import free_port
from tests.fixtures.postgres import TEMPLATE_DATABASE
from tests.support.processes import TEST_HEARTBEAT_TTL_S, service_env, terminate
from tests.support.site import make_site_dir

T = TypeVar("T")

SITE_OWNERS: Final = {"alpha": "ada", "beta": "bob"}
"""The stack's sites and the user who registered each."""

SERVICES: Final = {
    "projector": "lodestream.services.projector",
    "controller": "lodestream.services.controller",
    "api": "lodestream.services.api",
}
START_TIMEOUT_S: Final = 60.0

_databases = itertools.count()


class StackDidNotStart(RuntimeError):
    """The stack did not come up; the message carries the failing process's log tail."""


@dataclass
class Stack:
    root: Path
    nats: NatsServer
    control_password: str
    ca_file: Path
    seed_files: dict[str, Path]
    public_keys: dict[str, str]
    database_url: str
    api_url: str
    env: dict[str, str]
    tokens: dict[str, str] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def websocket_url(self) -> str:
        return self.nats.websocket_url

    @property
    def client_url(self) -> str:
        return self.nats.client_url

    @property
    def control_user(self) -> str:
        return CONTROL_USER

    def nats_settings(self) -> NatsSettings:
        return NatsSettings(
            url=self.client_url, user=CONTROL_USER, password=SecretStr(self.control_password)
        )

    def auth(self, user: str) -> dict[str, str]:
        """``Authorization`` header of ``user`` (one of the owners, or a user made by ``user``)."""
        if user not in self.tokens:
            self.tokens[user] = create_user(self.database_url, user)
        return {"Authorization": f"Bearer {self.tokens[user]}"}

    def log_path(self, name: str) -> Path:
        return self.root / f"{name}.log"

    def log_text(self, name: str) -> str:
        path = self.log_path(name)
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, name: str) -> None:
        """Start service ``name`` (a key of :data:`SERVICES`) as a child process."""
        assert not self.alive(name), f"{name} is already running"
        with self.log_path(name).open("ab") as log:
            self.processes[name] = subprocess.Popen(
                [sys.executable, "-m", SERVICES[name]],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def stop(self, name: str) -> None:
        """SIGTERM service ``name`` and wait for it (SIGKILL if it does not stop)."""
        proc = self.processes.pop(name, None)
        if proc is not None:
            terminate(proc)

    def kill(self, name: str) -> None:
        """SIGKILL service ``name`` (a test that left it unable to stop cleanly)."""
        proc = self.processes.pop(name, None)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def alive(self, name: str) -> bool:
        proc = self.processes.get(name)
        return proc is not None and proc.poll() is None

    def pilot(self, site: str, name: str) -> subprocess.Popen[bytes]:
        """Start a real pilot (``lode launcher``) of ``site`` in its own process group."""
        settings = make_site_dir(
            self.root / "sites" / name, site, wss_url=self.websocket_url, ca_file=self.ca_file,
            seed_file=self.seed_files[site],
        )  # fmt: skip
        argv = [sys.executable, "-m", "lodestream.client.cli.main", "launcher",
                "--site", str(settings.directory), "--wall-time-min", "10"]  # fmt: skip
        with self.log_path(name).open("ab") as log:
            # A session of its own, so the test can kill the pilot and the tasks it runs.
            return subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a process started with ``start_new_session`` and everything it started."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def kill_strays(root: Path) -> None:
    """SIGKILL every process whose working directory is under ``root``, by pid.

    A pilot killed with SIGKILL leaves the tasks it ran (each in a session of its own) to
    run on, as on a real node until the batch system reaps them; they all work in a
    directory of the pilot's site, under the stack's root.
    """
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = (entry / "cwd").resolve()
        except OSError:
            continue  # gone meanwhile, or not ours to inspect
        if cwd.is_relative_to(root.resolve()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)


def run_async(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion on a fresh loop in a worker thread (for sync fixtures)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()


@contextlib.contextmanager
def running_stack(
    root: Path,
    postgres: EmbeddedPostgres,
    *,
    env: Mapping[str, str] | None = None,
    leaf_sites: Collection[str] = (),
    heartbeat_ttl_s: float = TEST_HEARTBEAT_TTL_S,
) -> Iterator[Stack]:
    """A running stack under ``root``, with :data:`SITE_OWNERS` registered; torn down after.

    ``env`` adds to the services' environment (``LODE_CONTROLLER__SCALER_PERIOD_S``, ...).
    ``leaf_sites`` may connect a leaf node: the hub then has the JetStream domain
    :data:`~lodestream.infra.nats.leaf.HUB_DOMAIN` and accepts leaf connections.
    """
    root.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(kill_strays, root)  # last, once every service has stopped
        password = new_password()
        tls = ensure_local_ca(root / "tls")
        seeds = {site: new_user_seed() for site in SITE_OWNERS}
        seed_files = {site: write_seed(root / f"{site}.nk", s) for site, s in seeds.items()}
        public_keys = {site: user_public_key(s) for site, s in seeds.items()}
        server = NatsServer(
            NatsServerConfig(
                server_name="lode-security",
                store_dir=root / "nats" / "store",
                client_port=free_port(),
                http_port=free_port(),
                websocket_port=free_port(),
                tls=tls,
                authorization=render_authorization(
                    CONTROL_USER,
                    password,
                    public_keys,
                    leaf_sites=leaf_sites,
                    leaf_domain=HUB_DOMAIN if leaf_sites else None,
                ),
                jetstream_domain=HUB_DOMAIN if leaf_sites else None,
                leafnode_port=free_port() if leaf_sites else None,
            ),
            root / "nats",
        )
        server.start()
        cleanup.callback(server.stop)

        database = f"security_{os.getpid()}_{next(_databases)}"
        postgres.create_database(database, template=TEMPLATE_DATABASE, strategy="file_copy")
        cleanup.callback(postgres.drop_database, database)
        database_url = postgres.url(database)

        api_port = free_port()
        stack = Stack(
            root=root, nats=server, control_password=password, ca_file=tls.ca_cert,
            seed_files=seed_files, public_keys=public_keys, database_url=database_url,
            api_url=f"http://127.0.0.1:{api_port}", env={},
        )  # fmt: skip
        stack.env = {
            **service_env(stack.nats_settings(), database_url),
            "LODE_API__HOST": "127.0.0.1",
            "LODE_API__PORT": str(api_port),
            "LODE_API__WAIT_TIMEOUT_S": "20",
            "LODE_NATS__HEARTBEAT_TTL_S": str(heartbeat_ttl_s),
            **(env or {}),
        }
        # Once, before the services: they all ensure the streams at start, and would race.
        run_async(lambda: _ensure_streams(stack.nats_settings(), heartbeat_ttl_s))
        for name in SERVICES:
            stack.start(name)
        cleanup.callback(_stop_all, stack)
        _wait_ready(stack)
        for site, owner in SITE_OWNERS.items():
            _register_site(stack, site, owner)
        run_async(lambda: _wait_for_site_consumers(stack.nats_settings(), list(SITE_OWNERS)))
        yield stack


def _stop_all(stack: Stack) -> None:
    for name in list(stack.processes):
        stack.stop(name)


async def _ensure_streams(settings: NatsSettings, heartbeat_ttl_s: float) -> None:
    nc = await nats.connect(settings.url, user=settings.user, password=_secret(settings))
    try:
        await ensure_streams(nc.jetstream(), heartbeat_ttl_s=heartbeat_ttl_s)
    finally:
        await nc.close()


async def _wait_for_site_consumers(settings: NatsSettings, sites: list[str]) -> None:
    nc = await nats.connect(settings.url, user=settings.user, password=_secret(settings))
    try:
        js = nc.jetstream()
        async with asyncio.timeout(START_TIMEOUT_S):
            for name in (feed.durable(site) for site in sites for feed in SITE_CONSUMERS):
                while True:
                    try:
                        await js.consumer_info(EVENTS_STREAM, name)
                        break
                    except NotFoundError:
                        await asyncio.sleep(0.05)
    finally:
        await nc.close()


def _secret(settings: NatsSettings) -> str:
    assert settings.password is not None
    return settings.password.get_secret_value()


def _wait_ready(stack: Stack) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    with httpx.Client(base_url=stack.api_url, timeout=5) as client:
        while True:
            for name in SERVICES:
                if not stack.alive(name):
                    raise StackDidNotStart(
                        f"{name} exited during start:\n{stack.log_text(name)[-3000:]}"
                    )
            with contextlib.suppress(httpx.TransportError):
                if client.get("/readyz").status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise StackDidNotStart(f"the API is not ready:\n{stack.log_text('api')[-3000:]}")
            time.sleep(0.1)


def _register_site(stack: Stack, site: str, owner: str) -> None:
    with httpx.Client(base_url=stack.api_url, timeout=30) as client:
        response = client.post(
            "/sites",
            json={"name": site, "public_key": stack.public_keys[site]},
            params={"wait": "true"},
            headers=stack.auth(owner),
        )
    if response.status_code != 201:
        raise StackDidNotStart(f"registering {site}: {response.status_code} {response.text}")
