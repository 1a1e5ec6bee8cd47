"""Keeps the processes of ``lode up`` running: restarts with a capped exponential backoff.

One pass (:meth:`Supervisor.step`) looks at every process, restarts those that
exited once their backoff allows, then runs the periodic steps (credential
sync, status file). Nothing raised inside a pass ends the loop: each failure
is caught, logged, counted and tried again on a later pass, because a
supervisor that dies of one error leaves everything after it unsupervised.

Backoff: a process that had been up for ``stable_s`` is restarted at once; one
that dies again sooner (a crash loop), or whose restart fails, waits
``initial_s``, then twice as long each time, up to ``cap_s``.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)

Step = Callable[[], object]
_MIN_WAIT_S = 0.05


class Supervised(Protocol):
    """What the supervisor needs of a process (nats-server, Postgres, a service)."""

    @property
    def pid(self) -> int | None: ...

    @property
    def exited(self) -> bool:
        """Started, then ended on its own (a stop on purpose is not an exit)."""
        ...

    def restart(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Backoff:
    initial_s: float = 0.5
    cap_s: float = 30.0
    stable_s: float = 30.0

    def delay(self, failures: int) -> float:
        """Seconds to wait before the restart that follows ``failures`` quick failures."""
        if failures <= 0:
            return 0.0
        return float(min(self.initial_s * 2 ** (failures - 1), self.cap_s))


@dataclass(slots=True)
class ChildState:
    started_at: float
    restarts: int = 0  # restarts that succeeded
    failures: int = 0  # consecutive: restarts that failed or did not stay up for stable_s
    restart_errors: int = 0
    down_since: float | None = None
    next_attempt: float = 0.0
    last_error: str | None = None


@dataclass(slots=True)
class _Counters:
    passes: int = 0
    errors: int = 0
    last_error: str | None = None
    children: dict[str, ChildState] = field(default_factory=dict)


class Supervisor:
    """Restarts what exited and runs ``steps``, pass after pass; a pass never raises.

    ``processes`` is called on every pass, so processes added meanwhile (the
    demo's site agent) are supervised too. ``on_restart`` maps a process name to
    what must follow its restart (nats-server: re-apply the site credentials).
    """

    def __init__(
        self,
        processes: Callable[[], Iterable[tuple[str, Supervised]]],
        steps: Sequence[tuple[str, Step]] = (),
        *,
        on_restart: Mapping[str, Step] | None = None,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backoff = backoff or Backoff()
        self._processes = processes
        self._steps = list(steps)
        self._on_restart = dict(on_restart or {})
        self._clock = clock
        self._counters = _Counters()
        self._lock = threading.Lock()

    @property
    def passes(self) -> int:
        return self._counters.passes

    @property
    def errors(self) -> int:
        """Failures caught so far: steps and restarts that raised."""
        return self._counters.errors

    @property
    def last_error(self) -> str | None:
        return self._counters.last_error

    def child(self, name: str) -> ChildState | None:
        return self._counters.children.get(name)

    def step(self) -> None:
        """One pass: restart what exited (when its backoff allows), then run the steps."""
        with self._lock:
            processes: list[tuple[str, Supervised]] = []
            self._guard("listing processes", lambda: processes.extend(self._processes()))
            for name, process in processes:
                self._guard(f"supervising {name}", functools.partial(self._tend, name, process))
            for name, step in self._steps:
                self._guard(name, step)
            self._counters.passes += 1

    def run(self, stop: threading.Event, interval_s: float = 1.0) -> None:
        """Pass after pass until ``stop`` is set."""
        while not stop.wait(self._wait_s(interval_s)):
            self.step()

    def status(self, processes: Iterable[tuple[str, Supervised]] = ()) -> dict[str, Any]:
        """Counters as JSON-ready data, with the pids of ``processes``."""
        pids = {name: process.pid for name, process in processes}
        children: dict[str, Any] = {}
        for name in sorted(set(pids) | set(self._counters.children)):
            state = self._counters.children.get(name) or ChildState(started_at=0.0)
            entry = asdict(state)
            for key in ("started_at", "down_since", "next_attempt"):  # monotonic: not for humans
                entry.pop(key, None)
            children[name] = {"pid": pids.get(name), **entry}
        return {
            "supervisor": {"errors": self.errors, "last_error": self.last_error},
            "processes": children,
        }

    def _guard(self, what: str, action: Step) -> None:
        try:
            action()
        except Exception as exc:
            self._counters.errors += 1
            self._counters.last_error = f"{what}: {_describe(exc)}"
            log.exception("supervisor: %s failed; carrying on", what)

    def _tend(self, name: str, process: Supervised) -> None:
        now = self._clock()
        state = self._counters.children.setdefault(name, ChildState(started_at=now))
        if not process.exited:
            return
        if state.down_since is None:
            state.down_since = now
            if now - state.started_at >= self.backoff.stable_s:
                state.failures = 0
            state.next_attempt = now + self.backoff.delay(state.failures)
            log.warning("%s exited; restart in %.1fs", name, state.next_attempt - now)
        if now < state.next_attempt:
            return
        try:
            process.restart()
        except Exception as exc:
            state.failures += 1
            state.restart_errors += 1
            state.last_error = _describe(exc)
            state.next_attempt = now + self.backoff.delay(state.failures)
            self._counters.errors += 1
            self._counters.last_error = f"restarting {name}: {state.last_error}"
            log.exception("restarting %s failed; next try in %.1fs", name, state.next_attempt - now)
            return
        state.restarts += 1
        state.failures += 1  # forgiven on the next exit if it stays up for stable_s
        state.started_at = self._clock()
        state.down_since = None
        log.warning("%s restarted (pid %s)", name, process.pid)
        hook = self._on_restart.get(name)
        if hook is not None:
            hook()

    def _wait_s(self, interval_s: float) -> float:
        """Until the next pass: the interval, or sooner when a backoff ends sooner."""
        now = self._clock()
        pending = [
            state.next_attempt - now
            for state in self._counters.children.values()
            if state.down_since is not None
        ]
        return max(_MIN_WAIT_S, min([interval_s, *pending]))


def _describe(exc: BaseException) -> str:
    # str() rather than repr(): an OSError's str names the file, its repr does not.
    return f"{type(exc).__name__}: {exc}"
