"""``lode watch``: the real command, against the API on a loopback port and nats-server over
wss; its credential made and registered on first use, applied by the credential sync."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lodestream.schemas.codec import encode
from lodestream.schemas.events import JobFailed
from lodestream.schemas.events.job import FailureData
from lodestream.services.embedded.credentials import CredentialSync
from tests.fixtures.api import ApiHarness, served
from tests.fixtures.nats import RunningNats, SecureNats
from tests.support.builders import job_created
from tests.support.watching import append_jobs


@pytest.fixture
def nats_server(secure_nats: SecureNats) -> RunningNats:
    return secure_nats


async def test_lode_watch_shows_its_sites_live(
    api: ApiHarness, secure_nats: SecureNats, database_url: str, tmp_path: Path
) -> None:
    await api.register_site("ada", "alpha")
    api.user("ada")
    credential = tmp_path / "monitor.json"
    sync = CredentialSync(secure_nats.server, database_url, secure_nats.user, secure_nats.password)
    async with served(api) as base_url:
        env = {**os.environ, "LODE_API_URL": base_url, "LODE_TOKEN": api.tokens["ada"],
               "COLUMNS": "200"}  # fmt: skip
        argv = [sys.executable, "-m", "lodestream.client.cli.main", "watch", "--since", "1",
                "--credential", str(credential), "--nats-url", secure_nats.server.websocket_url,
                "--ca-file", str(secure_nats.ca_file),
                "--state-dir", str(tmp_path / ".lode")]  # fmt: skip
        # Popen returns at once; the command runs beside the API this loop serves.
        proc = subprocess.Popen(  # noqa: ASYNC220
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            async with asyncio.timeout(60):
                while not credential.exists() or not sync.sync_once():
                    assert proc.poll() is None, proc.communicate()
                    await asyncio.sleep(0.1)
            await append_jobs(api.js, "alpha", 3)
            created = job_created("alpha", "ada")
            failed = JobFailed.create(
                site="alpha", aggregate_id=created.aggregate_id, actor="controller:main",
                data=FailureData(reason="stage-in failed", cause=("no such file",)),
            )  # fmt: skip
            for event in (created, failed):
                await api.js.publish(event.subject, encode(event))
            await asyncio.sleep(3)  # it redraws meanwhile; what it shows last is printed at exit
            proc.send_signal(signal.SIGINT)
            out, err = await asyncio.to_thread(proc.communicate, timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    text = out.decode()
    assert proc.returncode == 0, text + err.decode()
    assert "alpha" in text
    assert "stage-in failed; no such file" in text
    assert "job.failed" in text


async def test_lode_watch_refuses_bad_input(api: ApiHarness, tmp_path: Path) -> None:
    await api.register_site("ada", "alpha")
    api.user("ada")
    async with served(api) as base_url:
        env = {**os.environ, "LODE_API_URL": base_url, "LODE_TOKEN": api.tokens["ada"]}
        base = [sys.executable, "-m", "lodestream.client.cli.main", "watch",
                "--state-dir", str(tmp_path / ".lode"), "--credential", str(tmp_path / "m.json"),
                "--nats-url", "wss://127.0.0.1:1"]  # fmt: skip

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*base, *args], env=env, capture_output=True, text=True,
                                  timeout=60, check=False)  # fmt: skip

        other = await asyncio.to_thread(run, "--site", "beta")
        assert other.returncode == 2
        assert "not one of your sites: beta" in other.stderr
        since = await asyncio.to_thread(run, "--since", "yesterday")
        assert since.returncode == 2
        assert "--since must be" in since.stderr
        beyond = await asyncio.to_thread(run, "--since", "999999")
        assert beyond.returncode == 1
        assert "beyond the end of the log" in beyond.stderr
        assert "Traceback" not in other.stderr + since.stderr + beyond.stderr
