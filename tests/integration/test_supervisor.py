"""The supervisor of ``lode up``: restarts with a capped backoff, and no error ends its loop.

Real child processes (``sleep``) stand in for the services; time is a fake
clock, so the backoff is checked without waiting for it.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from lodestream.services.embedded.process import ServiceProcess
from lodestream.services.embedded.supervisor import Backoff, Supervised, Supervisor


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def sleeper(tmp_path: Path) -> Iterator[ServiceProcess]:
    process = ServiceProcess("sleeper", ["sleep", "600"], {}, tmp_path / "sleeper.log")
    process.start()
    try:
        yield process
    finally:
        process.stop()


def kill(process: ServiceProcess) -> int:
    """SIGKILL ``process`` and reap it; returns the pid it had."""
    pid = process.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    while process.running:
        threading.Event().wait(0.01)
    return pid


def test_backoff_doubles_up_to_the_cap() -> None:
    backoff = Backoff(initial_s=0.5, cap_s=4.0)
    assert [backoff.delay(n) for n in range(7)] == [0.0, 0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_a_killed_process_is_restarted_at_once(sleeper: ServiceProcess) -> None:
    supervisor = Supervisor(lambda: [("sleeper", sleeper)], clock=FakeClock())
    supervisor.step()
    old_pid = kill(sleeper)

    supervisor.step()

    assert sleeper.running
    assert sleeper.pid != old_pid
    state = supervisor.child("sleeper")
    assert state is not None
    assert state.restarts == 1


def test_a_crash_loop_waits_longer_each_time(sleeper: ServiceProcess) -> None:
    clock = FakeClock()
    backoff = Backoff(initial_s=1.0, cap_s=4.0, stable_s=60.0)
    supervisor = Supervisor(lambda: [("sleeper", sleeper)], backoff=backoff, clock=clock)
    supervisor.step()
    waits = []
    for _ in range(5):
        kill(sleeper)  # dies again well within stable_s of its restart
        supervisor.step()
        waited = 0.0
        while not sleeper.running:
            clock.now += 0.25
            waited += 0.25
            supervisor.step()
        waits.append(waited)

    assert waits == [0.0, 1.0, 2.0, 4.0, 4.0]

    # Up for longer than stable_s: the next death is forgiven, restarted at once.
    clock.now += 60.0
    kill(sleeper)
    supervisor.step()
    assert sleeper.running


def test_a_failing_restart_is_counted_and_retried(tmp_path: Path) -> None:
    clock = FakeClock()
    missing = tmp_path / "not-yet"
    # Exits at once; its restart fails (the program is gone) until the file exists again.
    process = ServiceProcess("flaky", [sys.executable, "-c", "pass"], {}, tmp_path / "f.log")
    process.start()
    while process.running:
        threading.Event().wait(0.01)
    process.argv = [str(missing)]
    supervisor = Supervisor(
        lambda: [("flaky", process)], backoff=Backoff(initial_s=1.0), clock=clock
    )

    supervisor.step()
    supervisor.step()
    clock.now += 1.0
    supervisor.step()

    state = supervisor.child("flaky")
    assert state is not None
    assert state.restart_errors == 2
    assert state.restarts == 0
    assert supervisor.errors == 2
    assert "not-yet" in (supervisor.last_error or "")

    process.argv = ["sleep", "600"]
    clock.now += 10.0
    supervisor.step()
    try:
        assert process.running
        assert state.restarts == 1
    finally:
        process.stop()


def test_the_loop_survives_an_exception_in_one_step(sleeper: ServiceProcess) -> None:
    calls: list[int] = []

    def broken_step() -> None:
        calls.append(len(calls))
        raise RuntimeError("credential sync exploded")

    def broken_listing() -> list[tuple[str, Supervised]]:
        if len(calls) == 1:
            raise OSError("cannot list")
        return [("sleeper", sleeper)]

    supervisor = Supervisor(broken_listing, [("broken", broken_step)], clock=FakeClock())
    stop = threading.Event()
    thread = threading.Thread(target=supervisor.run, args=(stop, 0.01))
    thread.start()
    try:
        while supervisor.passes < 3:
            threading.Event().wait(0.01)
        old_pid = kill(sleeper)
        while not sleeper.running:  # still supervising after every pass raised
            threading.Event().wait(0.01)
        assert sleeper.pid != old_pid
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join()

    assert supervisor.errors >= 4  # every pass: the step; one pass: the listing too
    assert "credential sync exploded" in (supervisor.last_error or "")


def test_a_process_stopped_on_purpose_is_left_alone(sleeper: ServiceProcess) -> None:
    supervisor = Supervisor(lambda: [("sleeper", sleeper)], clock=FakeClock())
    sleeper.stop()

    supervisor.step()

    assert not sleeper.running
    assert supervisor.status([("sleeper", sleeper)])["processes"]["sleeper"] == {
        "pid": None,
        "restarts": 0,
        "failures": 0,
        "restart_errors": 0,
        "last_error": None,
    }


def test_a_hook_runs_after_a_restart(sleeper: ServiceProcess) -> None:
    restarted: list[int | None] = []
    supervisor = Supervisor(
        lambda: [("sleeper", sleeper)],
        on_restart={"sleeper": lambda: restarted.append(sleeper.pid)},
        clock=FakeClock(),
    )
    kill(sleeper)

    supervisor.step()

    assert restarted == [sleeper.pid]
