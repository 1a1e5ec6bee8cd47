"""``lode up`` as a user runs it: the demo, a restart on the same state, and what it survives.

The supervision tests share one ``lode up`` (module fixture); each kills one
part and waits until the stack is whole again, so they run in any order.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from lodestream.infra.postgres.hba import trusts
from lodestream.schemas.nkey import new_user_seed, user_public_key
from tests.fixtures.ports import free_port
from tests.fixtures.postgres import postgres_tempdir

pytestmark = pytest.mark.slow


def stack_ports() -> dict[str, int]:
    """Every port `lode up` listens on, each a free one (monitoring too: its default, the NATS
    port + 4000, is a port no one reserved)."""
    return {name: free_port() for name in ("nats", "ws", "monitor", "pg", "api")}


def up_argv(state: Path, ports: dict[str, int]) -> list[str]:
    return [
        sys.executable, "-m", "lodestream.client.cli.main", "up", "--state-dir", str(state),
        "--nats-port", str(ports["nats"]), "--websocket-port", str(ports["ws"]),
        "--monitor-port", str(ports["monitor"]),
        "--postgres-port", str(ports["pg"]), "--api-port", str(ports["api"]),
    ]  # fmt: skip


def lode_up(state: Path, ports: dict[str, int], *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [*up_argv(state, ports), *extra]
    env = {**os.environ, "COLUMNS": "200"}  # one table row per line, whatever the terminal
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False, env=env)


def test_lode_up_runs_the_demo_and_a_second_start_keeps_everything() -> None:
    with postgres_tempdir() as root:  # Postgres's own account must be able to reach it
        run_twice(root / "state")


def run_twice(state: Path) -> None:
    ports = stack_ports()
    first = lode_up(state, ports, "--demo", "--demo-jobs", "12", "--exit-after-demo")
    assert first.returncode == 0, first.stdout + first.stderr
    assert re.search(r"JOB_FINISHED\s*│\s*15\b", first.stdout)  # 12 eigh jobs + 3-job DAG
    assert re.search(r"DAG merge ran after both parents\s*│\s*yes", first.stdout)
    client = json.loads((state / "client.json").read_text())

    # Second start: same token, same jobs, the site's credential still accepted.
    second = subprocess.Popen(
        up_argv(state, ports), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
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


# --- supervision: everything `lode up` started comes back, whatever dies ------------------

# Generous limits for a loaded machine; tests wait for states, never assert durations.
WAIT_S = 120.0


class LodeUp:
    """One `lode up` process on a state dir, with what the tests read back from it."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.ports = stack_ports()
        self.api_url = f"http://127.0.0.1:{self.ports['api']}"
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            up_argv(self.state, self.ports),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.wait_for(lambda: self.ready() and (self.state / "status.json").exists(), "start")

    def stop(self) -> str:
        assert self.proc is not None
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=WAIT_S)
        assert self.proc.returncode == 0, out
        self.proc = None
        return out

    def status(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.state / "status.json").read_text())
        return data

    def process(self, name: str) -> dict[str, Any]:
        entry: dict[str, Any] = self.status()["processes"][name]
        return entry

    def ready(self) -> bool:
        """The API answers /readyz: it reaches NATS (the stream) and Postgres."""
        try:
            return httpx.get(f"{self.api_url}/readyz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    def admin_url(self) -> str:
        env = json.loads((self.state / "env.json").read_text())
        return str(env["database_urls"]["admin"])

    def wait_for(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not condition():
            assert self.proc is not None
            if self.proc.poll() is not None:
                out, _ = self.proc.communicate()
                raise AssertionError(f"lode up exited while waiting for {what}:\n{out}")
            if time.monotonic() > deadline:
                raise AssertionError(f"gave up waiting for {what}: {self.status()}")
            time.sleep(0.1)

    def kill_and_wait_restart(self, name: str) -> None:
        before = self.process(name)
        os.kill(before["pid"], signal.SIGKILL)
        self.wait_for(
            lambda: (
                self.process(name)["restarts"] > before["restarts"]
                and self.process(name)["pid"] not in (None, before["pid"])
            ),
            f"{name} to be restarted",
        )


@pytest.fixture(scope="module")
def lode_up_stack() -> Iterator[LodeUp]:
    with postgres_tempdir() as root:
        stack = LodeUp(root / "state")
        stack.start()
        try:
            yield stack
        finally:
            if stack.proc is not None:
                stack.stop()


def test_sigkilled_nats_server_is_restarted_and_the_services_reconnect(
    lode_up_stack: LodeUp,
) -> None:
    lode_up_stack.kill_and_wait_restart("nats-server")

    lode_up_stack.wait_for(lode_up_stack.ready, "the API to reach NATS again")
    assert lode_up_stack.status()["supervisor"]["errors"] == 0


def test_sigkilled_postgres_is_restarted_and_the_services_reconnect(
    lode_up_stack: LodeUp,
) -> None:
    lode_up_stack.kill_and_wait_restart("postgres")

    lode_up_stack.wait_for(lode_up_stack.ready, "the API to reach Postgres again")
    client = json.loads((lode_up_stack.state / "client.json").read_text())
    headers = {"Authorization": f"Bearer {client['token']}"}
    lode_up_stack.wait_for(
        lambda: httpx.get(f"{lode_up_stack.api_url}/jobs", headers=headers).status_code == 200,
        "an authenticated read",
    )


def test_a_bad_site_key_neither_stops_supervision_nor_the_next_lode_up(
    lode_up_stack: LodeUp,
) -> None:
    good = user_public_key(new_user_seed())
    bad = good[:-1] + ("A" if good[-1] != "A" else "B")  # the pattern holds, the checksum not
    with psycopg.connect(lode_up_stack.admin_url()) as conn:
        for name, key in (("good", good), ("broken", bad)):
            conn.execute(
                "INSERT INTO rm.sites (name, id, owner, public_key, created_at, last_seq) "
                "VALUES (%s, gen_random_uuid(), 'ada', %s, now(), 1)",
                (name, key),
            )
    config = lode_up_stack.state / "nats" / "nats-server.conf"
    lode_up_stack.wait_for(
        lambda: bool(lode_up_stack.status()["credentials"]["invalid"]), "the bad key reported"
    )
    credentials = lode_up_stack.status()["credentials"]
    assert set(credentials["invalid"]) == {"broken"}
    assert credentials["refused"] == 0
    assert good in config.read_text()  # the other sites' keys are applied all the same
    assert bad not in config.read_text()

    # Still supervising: a killed service comes back.
    lode_up_stack.kill_and_wait_restart("controller")

    # And a fresh `lode up` on this state starts, with the good key and without the bad one.
    lode_up_stack.stop()
    lode_up_stack.start()
    lode_up_stack.wait_for(lambda: good in config.read_text(), "the good key after a restart")
    assert bad not in config.read_text()
    assert set(lode_up_stack.status()["credentials"]["invalid"]) == {"broken"}


def test_admin_commands_work_from_the_state_dir_with_their_own_roles(
    lode_up_stack: LodeUp,
) -> None:
    def lode(*args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "lodestream.client.cli.main", *args, "--state-dir",
             str(lode_up_stack.state)],
            capture_output=True, text=True, timeout=WAIT_S, check=False,
            env={k: v for k, v in os.environ.items() if "DATABASE_URL" not in k},
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    token = lode("user", "create", "grace").strip().splitlines()[-1]
    headers = {"Authorization": f"Bearer {token}"}
    assert httpx.get(f"{lode_up_stack.api_url}/jobs", headers=headers).status_code == 200

    assert "rebuilt" in lode("projector", "rebuild")  # the projector's role swaps rm
    # Split: each spawned process writes the rebuilt tables with that role too.
    assert "folded by 2 processes" in lode("projector", "rebuild", "--workers", "2")
    assert "migrations applied" in lode("migrate")
    lode_up_stack.wait_for(lode_up_stack.ready, "the API after the rebuild")


def test_a_state_dir_from_a_trusting_lode_up_is_upgraded_and_keeps_its_data(
    lode_up_stack: LodeUp,
) -> None:
    client = json.loads((lode_up_stack.state / "client.json").read_text())
    headers = {"Authorization": f"Bearer {client['token']}"}
    lode_up_stack.stop()
    # What an older `lode up` left: trust authentication and no Postgres passwords at all.
    hba = lode_up_stack.state / "postgres" / "data" / "pg_hba.conf"
    hba.write_text("local all all trust\nhost all all 127.0.0.1/32 trust\n")
    secrets_file = lode_up_stack.state / "secrets.json"
    secrets = json.loads(secrets_file.read_text())
    del secrets["postgres"]
    secrets_file.write_text(json.dumps(secrets))

    lode_up_stack.start()

    assert not trusts(hba.read_text())
    assert "postgres" in json.loads(secrets_file.read_text())
    response = httpx.get(f"{lode_up_stack.api_url}/jobs", headers=headers)
    assert response.status_code == 200  # the user and token from before are still there
    with pytest.raises(psycopg.OperationalError, match="no password supplied"):
        psycopg.connect(f"postgresql://postgres@127.0.0.1:{lode_up_stack.ports['pg']}/lodestream")


def test_a_duplicate_key_is_shown_by_doctor_whoami_and_site_ls(lode_up_stack: LodeUp) -> None:
    """Issue 29, finding 3: a key bound twice (forced past the API) is left out and said so,
    to the operator (`lode doctor`) and to the owner (`lode whoami`, `lode site ls`)."""
    user = json.loads((lode_up_stack.state / "client.json").read_text())["user"]
    twin = user_public_key(new_user_seed())
    with psycopg.connect(lode_up_stack.admin_url()) as conn:
        for name in ("twin-a", "twin-b"):
            conn.execute(
                "INSERT INTO rm.sites (name, id, owner, public_key, created_at, last_seq) "
                "VALUES (%s, gen_random_uuid(), %s, %s, now(), 1)",
                (name, user, twin),
            )
    lode_up_stack.wait_for(
        lambda: (
            {r["holder"] for r in lode_up_stack.status()["credentials"]["rejected"]}
            >= {"twin-a", "twin-b"}
        ),
        "the duplicate left out",
    )
    assert twin not in (lode_up_stack.state / "nats" / "nats-server.conf").read_text()

    def lode(*args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LODE_")}
        return subprocess.run(
            [sys.executable, "-m", "lodestream.client.cli.main", *args, "--state-dir",
             str(lode_up_stack.state)],
            capture_output=True, text=True, timeout=WAIT_S, check=False,
            env={**env, "COLUMNS": "250"},
        )  # fmt: skip

    doctor = lode("doctor")
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    assert "credential sync: degraded" in doctor.stdout
    assert "twin-a" in doctor.stdout
    assert "also bound to a site" in doctor.stdout
    lode_up_stack.wait_for(
        lambda: "degraded" in lode("whoami").stdout, "the sync's state reaches the API"
    )
    whoami = lode("whoami")
    assert f"user: {user}" in whoami.stdout
    assert "client.json" in whoami.stdout  # where the token came from
    assert "left out: site twin-a" in whoami.stdout
    site_ls = lode("site", "ls")
    assert re.search(r"twin-a.*FAILED: its key is also bound to a site", site_ls.stdout)
    assert "credential sync: degraded" in site_ls.stderr


def test_site_init_keeps_a_registered_key_and_start_daemon_reports_failure(
    lode_up_stack: LodeUp, tmp_path: Path
) -> None:
    """Issue 31: `site init` on an existing name re-bound its key silently (its agent was cut
    off 30 s later), and `site start --daemon` said "started" of an agent that died at once."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LODE_")}

    def lode(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "lodestream.client.cli.main", *args],
            capture_output=True, text=True, timeout=WAIT_S, check=False,
            env={**env, "COLUMNS": "250"},
        )  # fmt: skip

    state = ["--state-dir", str(lode_up_stack.state)]
    first = lode("site", "init", str(tmp_path / "one"), "--name", "twice", *state)
    assert first.returncode == 0, first.stdout + first.stderr
    key = (tmp_path / "one" / "site.nk").read_bytes()

    again = lode("site", "init", str(tmp_path / "two"), "--name", "twice", *state)
    assert again.returncode == 2, again.stdout + again.stderr
    assert "already registered" in again.stderr
    assert "--rebind" in again.stderr
    assert not (tmp_path / "two").exists()  # nothing written, nothing re-bound

    # The agent of the first directory starts, connected with the key it was given.
    started = lode("site", "start", str(tmp_path / "one"), "--daemon")
    assert started.returncode == 0, started.stdout + started.stderr
    assert "site agent started" in started.stdout
    pid = int((tmp_path / "one" / "log" / "agent.pid").read_text())
    os.kill(pid, 0)  # alive
    assert lode("site", "stop", str(tmp_path / "one")).returncode == 0

    rebound = lode("site", "init", str(tmp_path / "three"), "--name", "twice", "--rebind",
                   "--yes", *state)  # fmt: skip
    assert rebound.returncode == 0, rebound.stdout + rebound.stderr
    assert (tmp_path / "three" / "site.nk").read_bytes() != key

    # An app file that does not load: the daemon says so, with the agent's own words.
    (tmp_path / "three" / "apps" / "broken.py").write_text("def run(:\n")
    broken = lode("site", "start", str(tmp_path / "three"), "--daemon")
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "exited at once" in broken.stderr
    assert "broken.py" in broken.stderr
    assert not (tmp_path / "three" / "log" / "agent.pid").exists()
