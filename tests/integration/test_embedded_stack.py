"""``lode up`` as a user runs it: the demo to completion, then a restart on the same state."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.fixtures.ports import free_port
from tests.fixtures.postgres import postgres_tempdir

pytestmark = pytest.mark.slow


def lode_up(state: Path, ports: dict[str, int], *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [
        sys.executable, "-m", "client.cli.main", "up", "--state-dir", str(state),
        "--nats-port", str(ports["nats"]), "--websocket-port", str(ports["ws"]),
        "--postgres-port", str(ports["pg"]), "--api-port", str(ports["api"]), *extra,
    ]  # fmt: skip
    env = {**os.environ, "COLUMNS": "200"}  # one table row per line, whatever the terminal
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False, env=env)


def test_lode_up_runs_the_demo_and_a_second_start_keeps_everything() -> None:
    with postgres_tempdir() as root:  # Postgres's own account must be able to reach it
        run_twice(root / "state")


def run_twice(state: Path) -> None:
    ports = {"nats": free_port(), "ws": free_port(), "pg": free_port(), "api": free_port()}
    # Monitoring listens on nats + 4000; keep it clear of the others.
    first = lode_up(state, ports, "--demo", "--demo-jobs", "12", "--exit-after-demo")
    assert first.returncode == 0, first.stdout + first.stderr
    assert re.search(r"JOB_FINISHED\s*│\s*15\b", first.stdout)  # 12 eigh jobs + 3-job DAG
    assert re.search(r"DAG merge ran after both parents\s*│\s*yes", first.stdout)
    client = json.loads((state / "client.json").read_text())

    # Second start: same token, same jobs, the site's credential still accepted.
    second = subprocess.Popen(
        [sys.executable, "-m", "client.cli.main", "up", "--state-dir", str(state),
         "--nats-port", str(ports["nats"]), "--websocket-port", str(ports["ws"]),
         "--postgres-port", str(ports["pg"]), "--api-port", str(ports["api"])],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        headers = {"Authorization": f"Bearer {client['token']}"}
        url = f"http://127.0.0.1:{ports['api']}"
        for _ in range(600):
            try:
                response = httpx.get(f"{url}/jobs", params={"limit": 100}, headers=headers)
                if response.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            subprocess.run(["sleep", "0.1"], check=True)
        jobs = response.json()["items"]
        assert len(jobs) == 15
        assert {j["state"] for j in jobs} == {"JOB_FINISHED"}
    finally:
        second.terminate()
        out, _ = second.communicate(timeout=60)
    assert second.returncode == 0, out
    assert "stopped; state kept in" in out
