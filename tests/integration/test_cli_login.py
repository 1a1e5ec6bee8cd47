"""``lode login``: the real command against the API served on a loopback port, in a home of
its own: the token is checked before it is saved, and the watch credential is registered."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from lodestream.client.credential import MonitorCredential
from tests.fixtures.api import ApiHarness, served


async def lode_login(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(home), "COLUMNS": "200"}
    env.pop("LODE_TOKEN", None)
    env.pop("LODE_API_URL", None)
    argv = [sys.executable, "-m", "lodestream.client.cli.main", "login", *args]
    return await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, env=env, timeout=60, check=False
    )


def config_dir(home: Path) -> Path:
    return home / ".config" / "lodestream"


async def test_a_good_token_is_saved_for_this_user_only(api: ApiHarness, tmp_path: Path) -> None:
    api.user("ada")
    async with served(api) as base_url:
        done = await lode_login(tmp_path, "--api-url", base_url + "/", "--token",
                                api.tokens["ada"])  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    saved = config_dir(tmp_path) / "client.json"
    assert json.loads(saved.read_text()) == {"api_url": base_url, "token": api.tokens["ada"]}
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert not (config_dir(tmp_path) / "monitor.json").exists()


async def test_a_wrong_token_is_told_and_nothing_is_saved(api: ApiHarness, tmp_path: Path) -> None:
    async with served(api) as base_url:
        done = await lode_login(tmp_path, "--api-url", base_url, "--token", "not-a-token")
    assert done.returncode == 1
    assert "login refused: 401" in done.stderr
    assert not config_dir(tmp_path).exists()


async def test_with_a_nats_address_the_watch_credential_is_made_and_registered(
    api: ApiHarness, tmp_path: Path
) -> None:
    headers = api.user("ada")
    async with served(api) as base_url:
        done = await lode_login(tmp_path, "--api-url", base_url, "--token", api.tokens["ada"],
                                "--nats-url", "wss://127.0.0.1:4443")  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        registered = (await api.client.get("/users/me/monitoring-key", headers=headers)).json()
    credential = config_dir(tmp_path) / "monitor.json"
    assert stat.S_IMODE(credential.stat().st_mode) == 0o600
    stored = MonitorCredential.load(credential)
    assert stored.nats_url == "wss://127.0.0.1:4443"
    assert registered["public_key"] == stored.public_key
    assert "monitoring credential made and registered" in done.stdout
