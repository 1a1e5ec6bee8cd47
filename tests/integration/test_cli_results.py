"""``lode job wait|result``, listings that refuse what they cannot show, one tag syntax,
``lode token ls|revoke``, ``lode whoami``'s sources, and the unreachable API's message: the
real command in a subprocess against the API served on a loopback port."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from lodestream.client.config import ClientConfig
from lodestream.client.sdk import LodeClient
from tests.integration.test_cli_jobs import SITES, USER, Cli, batch, cli  # noqa: F401

__all__ = ["cli"]


async def test_wait_follows_the_feed_until_final_and_names_the_jobs_that_failed(cli: Cli) -> None:
    response = await cli.api.submit(USER, batch(3, run="w"))
    ids = [job["id"] for job in response.json()["jobs"]]
    env = {**os.environ, "LODE_API_URL": cli.base_url, "LODE_TOKEN": cli.api.tokens[USER]}
    waiter = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lodestream.client.cli.main", "job", "wait", "--tag", "run:w",
        "--state-dir", str(cli.tmp / ".lode"), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    await asyncio.sleep(1.0)  # not final yet: it waits (on the feed, not polling per job)
    assert waiter.returncode is None
    sdk = LodeClient(ClientConfig(cli.base_url, cli.api.tokens[USER]))
    done = await asyncio.to_thread(sdk.kill_jobs, tags=["run:w"], reason="enough")
    assert done["acted"] == 3
    out, err = await asyncio.wait_for(waiter.communicate(), 60)
    assert waiter.returncode == 1, out + err
    lines = err.decode().splitlines()
    assert sum(line.startswith(("1/3 ", "2/3 ", "3/3 ")) for line in lines) == 3  # no TTY
    for job_id in ids:
        assert f"{job_id} KILLED: enough" in lines
    assert "3 jobs final: 0 JOB_FINISHED, 3 did not finish" in out.decode()

    shown = await cli.run("job", "result", ids[0][-8:])
    assert shown.returncode == 1
    assert "state: KILLED" in shown.stdout
    assert "reason: enough" in shown.stdout
    doc = json.loads((await cli.run("job", "result", ids[0], "--json")).stdout)
    assert (doc["state"], doc["final"]) == ("KILLED", True)
    again = await cli.run("job", "wait", *ids)  # all final already: at once
    assert again.returncode == 1
    assert "3 jobs final" in again.stdout

    fresh = (await cli.api.submit(USER, batch(1))).json()["jobs"][0]["id"]
    pending = await cli.run("job", "result", fresh)
    assert pending.returncode == 1
    assert "not final yet: `lode job result --wait" in pending.stderr


async def test_submit_needs_no_workdir_and_says_what_wait_waits_for(cli: Cli) -> None:
    out = await cli.ok("job", "submit", "--site", "theta", "--app", "sim", "-p", "n=1",
                       "-t", "run:x", "--wait")  # fmt: skip
    [job] = await cli.jobs("--tag", "run:x")
    assert job["id"] == out.split()[0]
    assert job["workdir"].startswith("runs/")
    assert "not once they ran" in " ".join((await cli.ok("job", "submit", "--help")).split())


async def test_one_tag_syntax_and_listings_that_say_what_they_cannot_show(cli: Cli) -> None:
    for command in (("job", "ls"), ("job", "kill"), ("job", "wait"), ("job", "submit",
                    "--site", "theta", "--app", "sim"), ("queue", "submit", "--site", "theta",
                    "-t", "5")):  # fmt: skip
        message = await cli.usage_error(*command, "--tag", "run=a")
        assert "--tag must look like key:value, got 'run=a'; write --tag run:a" in message

    for args in (("job", "ls", "--site", "nosuch"), ("events", "--site", "nosuch"),
                 ("job", "kill", "--site", "nosuch", "--yes")):  # fmt: skip
        result = await cli.run(*args)
        assert result.returncode == 1, args
        assert "404 not_found: site 'nosuch' not found" in result.stderr, args

    assert (await cli.api.submit(USER, batch(12))).status_code == 201
    cut = await cli.run("job", "ls", "--limit", "10")
    assert cut.returncode == 0
    assert "showing the newest 10 jobs; more match: --limit N for more, --all" in cut.stderr
    assert len(await cli.jobs("--all")) == 12
    assert "more match" not in (await cli.run("job", "ls")).stderr


async def test_tokens_are_listed_and_revoked_and_whoami_names_every_source(cli: Cli) -> None:
    listed = json.loads(await cli.ok("token", "ls", "--json"))
    assert [t["current"] for t in listed] == [True]
    assert cli.api.tokens[USER] not in json.dumps(listed)

    # A ./.lode/client.json shadows lode login's file; LODE_TOKEN shadows both: whoami says.
    state = cli.tmp / ".lode"
    state.mkdir(exist_ok=True)
    (state / "client.json").write_text(json.dumps({"api_url": cli.base_url, "token": "old"}))
    who = json.loads(await cli.ok("whoami", "--json"))
    assert (who["token_origin"], who["api_url_origin"]) == ("LODE_TOKEN", "LODE_API_URL")
    assert who["unused_tokens"] == [str(state / "client.json")]
    assert f"not used: the token in {state / 'client.json'}" in await cli.ok("whoami")

    revoked = await cli.ok("token", "revoke", listed[0]["id"])
    assert revoked.startswith(f"revoked {listed[0]['id']}")
    refused = await cli.run("token", "ls")
    assert refused.returncode == 1
    assert "401 unauthorized: invalid or revoked token" in refused.stderr
    del cli.api.tokens[USER]


async def test_an_api_that_does_not_answer_is_named_with_what_to_do(
    cli: Cli, tmp_path: Path
) -> None:
    env = {**os.environ, "LODE_API_URL": "http://127.0.0.1:9", "LODE_TOKEN": "t"}
    result = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lodestream.client.cli.main", "job", "ls", env=env,
        cwd=tmp_path, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await result.communicate()
    assert result.returncode == 1
    message = " ".join(err.decode().split())
    assert message.startswith("error: cannot reach the API at http://127.0.0.1:9: ")
    assert "Is the stack running? `lode up` starts a local one (the URL is from LODE_API_URL)" in (
        message
    )


def test_from_config_reads_the_state_dir_the_cli_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "elsewhere"
    state.mkdir()
    (state / "client.json").write_text(json.dumps({"api_url": "http://x:1/", "token": "s"}))
    monkeypatch.delenv("LODE_API_URL", raising=False)
    monkeypatch.delenv("LODE_TOKEN", raising=False)
    monkeypatch.setenv("LODE_STATE_DIR", str(state))
    monkeypatch.chdir(tmp_path)
    with LodeClient.from_config() as client:
        assert (client.config.api_url, client.config.token) == ("http://x:1", "s")
        assert client.config.origin == str(state / "client.json")
