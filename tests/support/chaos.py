"""Chaos under load: the whole stack as real processes, SIGKILLed in turn and brought back.

A :class:`Chaos` owns every process of a running stack — nats-server and
Postgres (restarted on the same store and data directory), the projector,
the controller and the site agent (restarted as ``lode up`` would), and the
pilots (a killed or exited pilot is replaced by a new one, as a batch
scheduler would). :meth:`Chaos.supervise` restarts whatever ends that the
test did not kill, and remembers it: a service that dies of someone else's
fault is a finding, not noise.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from lodestream.infra.nats.server import NatsServer
from lodestream.infra.postgres.errors import PostgresStartError
from lodestream.infra.postgres.server import EmbeddedPostgres

CHAOS_DATABASE: Final = "lode_chaos"
COMPONENTS: Final = ("projector", "controller", "agent", "pilot", "nats", "postgres")
SERVICES: Final = {
    "projector": "lodestream.services.projector",
    "controller": "lodestream.services.controller",
}
_STOP_TIMEOUT_S: Final = 20.0
_POLL_S: Final = 0.2
_PG_START_ATTEMPTS: Final = 20


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.strip() else default


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "")
    return float(value) if value.strip() else default


@dataclass(frozen=True, slots=True)
class ChaosPlan:
    """How big and how violent a run is; ``from_env`` reads ``LODE_CHAOS_*``."""

    jobs: int = 48
    rounds: int = 1
    pause_s: float = 3.0  # between two kills
    down_s: float = 1.0  # how long a killed server or service stays dead
    # Every second round keeps nats-server and Postgres down this long: longer than the
    # heartbeat TTL (3 s in tests), so no pilot can heartbeat for longer than its TTL.
    long_down_s: float = 5.0
    pilots: int = 1
    chain_every: int = 4  # every n-th job starts a chain parent → child → grandchild
    run_s: tuple[float, ...] = (0.3, 0.6, 1.0)  # how long the app sleeps, cycled over jobs

    @classmethod
    def from_env(cls) -> ChaosPlan:
        """``make chaos`` sets ``LODE_CHAOS_JOBS`` and ``LODE_CHAOS_ROUNDS`` (and may set more)."""
        default = cls()
        rounds = _env_int("LODE_CHAOS_ROUNDS", default.rounds)
        jobs = _env_int("LODE_CHAOS_JOBS", default.jobs)
        return cls(
            jobs=jobs,
            rounds=rounds,
            pause_s=_env_float("LODE_CHAOS_PAUSE_S", default.pause_s),
            down_s=_env_float("LODE_CHAOS_DOWN_S", default.down_s),
            long_down_s=_env_float("LODE_CHAOS_LONG_DOWN_S", default.long_down_s),
            pilots=_env_int("LODE_CHAOS_PILOTS", 2 if jobs > default.jobs else default.pilots),
        )

    def down_for(self, component: str, round_: int) -> float:
        if component in {"nats", "postgres"} and round_ % 2 == 1:
            return self.long_down_s
        return self.down_s

    @property
    def chaos_s(self) -> float:
        """Roughly how long the kills take: the submitter spreads the jobs over it."""
        return sum(
            self.pause_s + self.down_for(component, r)
            for r in range(self.rounds)
            for component in COMPONENTS
        )

    @property
    def timeout_s(self) -> float:
        """The pytest timeout: generous, since the drain after the last kill is not timed."""
        return 240.0 + 2 * self.chaos_s + self.jobs * 0.5


@dataclass(slots=True)
class Child:
    """One child process, started again on demand with the same command and a fresh log."""

    name: str
    argv: Sequence[str]
    env: dict[str, str]
    log_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    killed: bool = False  # by the test: its end is no news

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}.{self.starts}.log"

    def start(self) -> None:
        self.starts += 1
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                list(self.argv), env=self.env, stdout=log, stderr=subprocess.STDOUT
            )

    @property
    def exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL and reap: no shutdown, no goodbye events."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        """SIGTERM (the clean stop), escalating to SIGKILL if it hangs."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True, slots=True)
class Happening:
    """Something the run did or saw, for the report (``at`` is seconds since the start)."""

    at: float
    component: str
    what: str

    def __str__(self) -> str:
        return f"{self.at:7.1f}s {self.component:<10} {self.what}"


class Chaos:
    """The processes of one stack, the kills, and what happened (see the module docstring)."""

    def __init__(
        self,
        *,
        nats: NatsServer,
        postgres: EmbeddedPostgres,
        service_env: dict[str, str],
        site_dir: Path,
        log_dir: Path,
        plan: ChaosPlan,
    ) -> None:
        self.nats = nats
        self.postgres = postgres
        self.site_dir = site_dir
        self.log_dir = log_dir
        self.plan = plan
        self.services = {
            name: Child(name, [sys.executable, "-m", module], service_env, log_dir)
            for name, module in SERVICES.items()
        }
        agent = [sys.executable, "-m", "lodestream.client.cli.main", "site", "start", str(site_dir)]
        self.services["agent"] = Child("agent", agent, dict(os.environ), log_dir)
        self.pilots: list[Child] = []
        self.happenings: list[Happening] = []
        self.unexpected: list[Happening] = []  # what ended without being killed by the test
        self._down: set[str] = set()  # killed on purpose and not back yet: not to be restarted
        self._pilot_count = 0
        self._t0 = time.monotonic()

    def note(self, component: str, what: str, *, unexpected: bool = False) -> None:
        happening = Happening(time.monotonic() - self._t0, component, what)
        self.happenings.append(happening)
        if unexpected:
            self.unexpected.append(happening)

    # --- starting -------------------------------------------------------------------------

    def start_service(self, name: str) -> None:
        self.services[name].start()

    def start_pilot(self) -> Child:
        self._pilot_count += 1
        argv = [sys.executable, "-m", "lodestream.client.cli.main", "launcher",
                "--site", str(self.site_dir), "--wall-time-min", "120"]  # fmt: skip
        pilot = Child(f"pilot-{self._pilot_count}", argv, dict(os.environ), self.log_dir)
        pilot.start()
        self.pilots.append(pilot)
        return pilot

    # --- supervision ----------------------------------------------------------------------

    async def supervise(self, stop: asyncio.Event) -> None:
        """Bring back what ended on its own; keep ``plan.pilots`` pilots alive."""
        while not stop.is_set():
            for name, child in self.services.items():
                if name not in self._down and child.exited:
                    assert child.proc is not None
                    self.note(name, f"exited by itself (rc {child.proc.returncode}); restarted:\n"
                                    f"{child.log_tail()}", unexpected=True)  # fmt: skip
                    await asyncio.to_thread(child.start)
            for pilot in [p for p in self.pilots if p.exited and not p.killed]:
                self.pilots.remove(pilot)
                assert pilot.proc is not None
                self.note(pilot.name, f"exited (rc {pilot.proc.returncode}): {_last_line(pilot)}")
            if "pilot" not in self._down:
                while len(self.pilots) < self.plan.pilots:
                    pilot = await asyncio.to_thread(self.start_pilot)
                    self.note(pilot.name, "started (the batch scheduler's replacement)")
            await self._servers_alive()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), _POLL_S)

    async def _servers_alive(self) -> None:
        if "nats" not in self._down and self.nats.exited:
            self.note("nats", "exited by itself; restarted", unexpected=True)
            await asyncio.to_thread(self.nats.restart)
        if "postgres" not in self._down and self.postgres.exited:
            self.note("postgres", "exited by itself; restarted", unexpected=True)
            await asyncio.to_thread(restart_postgres, self.postgres)

    # --- killing --------------------------------------------------------------------------

    async def kill(self, component: str, down_s: float) -> None:
        """SIGKILL ``component``, leave it dead for ``down_s``, bring it back."""
        self._down.add(component)
        try:
            if component in self.services:
                await self._kill_service(component, down_s)
            elif component == "pilot":
                await self._kill_pilot()
            elif component == "nats":
                await asyncio.to_thread(self.nats.kill)
                self.note("nats", f"SIGKILL (down for {down_s:g} s)")
                await asyncio.sleep(down_s)
                await asyncio.to_thread(self.nats.restart)
                self.note("nats", "restarted on the same store")
            elif component == "postgres":
                await asyncio.to_thread(self.postgres.kill)
                self.note("postgres", f"SIGKILL (postmaster; down for {down_s:g} s)")
                await asyncio.sleep(down_s)
                await asyncio.to_thread(restart_postgres, self.postgres)
                self.note("postgres", "restarted (crash recovery)")
            else:
                raise ValueError(f"unknown component {component!r}")
        finally:
            self._down.discard(component)

    async def _kill_service(self, name: str, down_s: float) -> None:
        child = self.services[name]
        await asyncio.to_thread(child.kill)
        self.note(name, "SIGKILL")
        await asyncio.sleep(down_s)
        await asyncio.to_thread(child.start)
        self.note(name, "restarted")

    async def _kill_pilot(self) -> None:
        alive = [p for p in self.pilots if p.running]
        if not alive:
            self.note("pilot", "no pilot alive to kill")
            return
        victim = alive[0]
        victim.killed = True
        await asyncio.to_thread(victim.kill)
        self.pilots.remove(victim)
        self.note(victim.name, "SIGKILL; the scheduler starts another")

    async def run_schedule(self) -> None:
        """Every component in turn, ``plan.rounds`` times, ``plan.pause_s`` apart."""
        for round_ in range(self.plan.rounds):
            for component in COMPONENTS:
                await asyncio.sleep(self.plan.pause_s)
                await self.kill(component, self.plan.down_for(component, round_))

    # --- the end --------------------------------------------------------------------------

    def stop_site(self) -> None:
        """Stop the pilots and the site agent cleanly (SIGTERM)."""
        self._down.update({"pilot", "agent"})
        for pilot in self.pilots:
            pilot.stop()
        self.services["agent"].stop()

    def stop_all(self) -> None:
        self._down.update(COMPONENTS)
        for pilot in self.pilots:
            pilot.stop()
        for child in self.services.values():
            child.stop()

    def report(self) -> str:
        return "\n".join(str(h) for h in self.happenings)


def restart_postgres(server: EmbeddedPostgres) -> None:
    """Start again on the same data directory and port, retrying while the old backends linger."""
    for attempt in range(1, _PG_START_ATTEMPTS + 1):
        try:
            server.start()
        except PostgresStartError:
            if attempt == _PG_START_ATTEMPTS:
                raise
            time.sleep(0.5)
        else:
            return


def _last_line(child: Child) -> str:
    lines = [line for line in child.log_tail(5).splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"
