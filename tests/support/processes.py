"""Services as real child processes, for fault-injection tests that SIGKILL them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lodestream.settings import NatsSettings

TEST_HEARTBEAT_TTL_S = 3.0


def service_env(nats: NatsSettings, database_url: str) -> dict[str, str]:
    env = {
        **os.environ,
        "LODE_NATS_URL": nats.url,
        "LODE_DATABASE_URL": database_url,
        "LODE_PROJECTOR__BATCH_SIZE": "500",
        # Pilots in tests heartbeat for a 3 s TTL (tests/support/site.py); the stream agrees.
        "LODE_NATS__HEARTBEAT_TTL_S": str(TEST_HEARTBEAT_TTL_S),
    }
    if nats.stream_replicas != 1:  # a cluster: R3 streams, as an operator sets it
        env["LODE_NATS__STREAM_REPLICAS"] = str(nats.stream_replicas)
    if nats.user:
        env["LODE_NATS__USER"] = nats.user
    if nats.password:
        env["LODE_NATS__PASSWORD"] = nats.password.get_secret_value()
    return env


@contextmanager
def service_process(
    module: str, env: dict[str, str], log_path: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``python -m module``; SIGTERM it on exit unless the test already killed it."""
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", module], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            yield proc
        finally:
            terminate(proc)


STOP_TIMEOUT_S = 15.0


def terminate(proc: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM ``proc``, and SIGKILL it if it has not exited within ``timeout_s``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
