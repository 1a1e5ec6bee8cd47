"""The stack under benchmark: ``EmbeddedStack`` in a temp dir on free loopback ports.

Also swaps a service for a copy of itself running under cProfile, so a phase
can say where a service spends its time without editing the service.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pstats
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from lodestream.services.embedded import EmbeddedStack, StackInfo, StackPorts
from lodestream.services.embedded.process import ServiceProcess

log = logging.getLogger(__name__)

SERVICE_START_TIMEOUT_S = 60.0
PROFILE_WRITE_TIMEOUT_S = 30.0


class BenchError(RuntimeError):
    """A phase could not measure what it set out to; the message says what and why."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def free_ports() -> StackPorts:
    return StackPorts(
        nats=free_port(),
        websocket=free_port(),
        nats_http=free_port(),
        postgres=free_port(),
        api=free_port(),
    )


class BenchStack:
    """Start with :meth:`start` (outside any event loop), always :meth:`stop`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.embedded = EmbeddedStack(root / "state", free_ports())
        self._info: StackInfo | None = None

    @property
    def info(self) -> StackInfo:
        if self._info is None:
            raise BenchError("the stack is not running")
        return self._info

    def start(self) -> StackInfo:
        started = time.perf_counter()
        self._info = self.embedded.start("bench")
        # The benchmarks append the controller's events themselves (see bench.run).
        self.stop_service("controller")
        log.info("stack up in %.1fs at %s", time.perf_counter() - started, self.root)
        return self._info

    def stop(self) -> None:
        self.embedded.stop()

    def service(self, name: str) -> ServiceProcess:
        for service in self.embedded.services:
            if service.name == name:
                return service
        raise BenchError(f"no service {name!r} in the stack")

    def pids(self) -> dict[str, int]:
        """Pids of the stack's processes by component (Postgres: the postmaster)."""
        found: dict[str, int] = {}
        if self.embedded.nats is not None and self.embedded.nats.pid is not None:
            found["nats-server"] = self.embedded.nats.pid
        if self.embedded.postgres is not None and self.embedded.postgres.pid is not None:
            found["postgres"] = self.embedded.postgres.pid
        for service in self.embedded.services:
            if service.pid is not None:
                found[service.name] = service.pid
        return found

    def restart(self, name: str) -> None:
        service = self.service(name)
        service.stop()
        service.start()
        self.wait_service(name)

    def wait_service(self, name: str) -> None:
        """Until the API answers /healthz (other services: until they are alive)."""
        service = self.service(name)
        deadline = time.monotonic() + SERVICE_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if not service.running:
                raise BenchError(f"{name} exited:\n{service.log_tail()}")
            if name != "api" or _healthy(f"{self.info.api_url}/healthz"):
                return
            time.sleep(0.1)
        raise BenchError(f"{name} not healthy after {SERVICE_START_TIMEOUT_S:.0f}s")

    @contextlib.contextmanager
    def profiled(self, name: str, module: str, out: Path) -> Iterator[ServiceProcess]:
        """Run ``name`` under :mod:`bench.profiled_service`, profile the block, then restore."""
        original = self.service(name)
        original.stop()
        argv = [sys.executable, "-m", "bench.profiled_service", str(out), module]
        profiled = ServiceProcess(name, argv, original.env, original.log_path)
        index = self.embedded.services.index(original)
        self.embedded.services[index] = profiled
        try:
            profiled.start()
            self.wait_service(name)
            time.sleep(1.0)  # the service connects and positions its consumers first
            _signal(profiled, signal.SIGUSR1)
            yield profiled
            _signal(profiled, signal.SIGUSR2)
            deadline = time.monotonic() + PROFILE_WRITE_TIMEOUT_S
            while not out.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            profiled.stop()
            self.embedded.services[index] = original
            original.start()
            self.wait_service(name)

    def stop_service(self, name: str) -> None:
        self.service(name).stop()

    def start_service(self, name: str) -> None:
        service = self.service(name)
        if not service.running:
            service.start()
        self.wait_service(name)


def _signal(service: ServiceProcess, signum: int) -> None:
    if service.pid is None or not service.running:
        raise BenchError(f"{service.name} is not running:\n{service.log_tail()}")
    os.kill(service.pid, signum)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def load_profile(path: Path) -> pstats.Stats | None:
    if not path.exists():
        return None
    return pstats.Stats(str(path))
