"""``lode job show`` and ``lode site transfers``: the real command against the API served on a
loopback port, with transfer items appended as their writers append them."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from lodestream.schemas.events.xfer import TransferDoneData, TransferSubmittedData
from tests.fixtures.api import ApiHarness, served
from tests.support.staging import SITE, Staged, report, staged_job

COMMAND_TIMEOUT_S = 60.0
SLOTS = {"input", "params", "results"}


@dataclass(frozen=True)
class Cli:
    api: ApiHarness
    base_url: str
    state_dir: Path

    async def run(self, user: str, *args: str) -> subprocess.CompletedProcess[str]:
        """``lode <args>`` as ``user``, in a subprocess (the server runs in this event loop)."""
        self.api.user(user)
        env = {**os.environ, "LODE_API_URL": self.base_url, "LODE_TOKEN": self.api.tokens[user],
               "COLUMNS": "250"}  # fmt: skip
        argv = [sys.executable, "-m", "lodestream.client.cli.main", *args,
                "--state-dir", str(self.state_dir)]  # fmt: skip
        return await asyncio.to_thread(
            subprocess.run, argv, capture_output=True, text=True, env=env,
            timeout=COMMAND_TIMEOUT_S, check=False,
        )  # fmt: skip

    async def ok(self, user: str, *args: str) -> str:
        result = await self.run(user, *args)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout


@pytest.fixture
async def cli(api: ApiHarness, tmp_path: Path) -> AsyncIterator[Cli]:
    async with served(api) as base_url:
        yield Cli(api, base_url, tmp_path / ".lode")


@pytest.fixture
async def staged(api: ApiHarness) -> Staged:
    return await staged_job(api)


def rows(output: str) -> list[list[str]]:
    """The cells of every table row printed (header rows included)."""
    return [
        [cell.strip() for cell in re.split("[│┃]", line)[1:-1]]
        for line in output.splitlines()
        if line.startswith(("│", "┃"))
    ]


async def test_job_show_prints_its_transfers(cli: Cli, staged: Staged) -> None:
    await report(cli.api.js, staged.params, TransferSubmittedData(task_id="task-4"))
    done = TransferDoneData(bytes_transferred=3_500_000, duration_s=75.0)
    await cli.api.wait_projected(await report(cli.api.js, staged.params, done))

    output = await cli.ok("alice", "job", "show", staged.job)

    assert '"transfer_items"' not in output  # a table, not JSON
    assert f'"id": "{staged.job}"' in output
    transfers = [row for row in rows(output) if row[0] in SLOTS]
    assert transfers == [
        ["input", "in", "archive:/data/in.h5", "submitted", "2", "", "", "task task-3"],
        ["params", "in", "dtn:/cfg/[run 1].json", "succeeded", "1", "3.3 MiB", "1m15s", ""],
        ["results", "out", "archive:/results/run1/…", "pending", "0", "", "", ""],
    ]
    assert any(row[1] == "job.created" for row in rows(output))  # the history follows


async def test_site_transfers_lists_what_is_in_flight(cli: Cli, staged: Staged) -> None:
    output = await cli.ok("alice", "site", "transfers", SITE)

    header, *items = rows(output)
    assert header == ["job", "slot", "dir", "remote", "state", "attempts", "bytes", "duration",
                      "reason", "updated"]  # fmt: skip
    assert [(row[0], row[1], row[4]) for row in items] == [
        (staged.job, "results", "pending"),
        (staged.job, "input", "submitted"),
        (staged.job, "params", "pending"),
    ]


async def test_site_transfers_by_state(cli: Cli, staged: Staged) -> None:
    output = await cli.ok("alice", "site", "transfers", SITE, "--state", "failed")

    [_, failed] = rows(output)
    assert (failed[1], failed[4], failed[8]) == ("input", "failed", "no such file (permanent)")


async def test_site_transfers_json_is_the_apis(cli: Cli, staged: Staged) -> None:
    printed = await cli.ok("alice", "site", "transfers", SITE, "--json", "--direction", "in")
    response = await cli.api.client.get(
        f"/sites/{SITE}/transfers", params={"direction": "in"}, headers=cli.api.user("alice")
    )

    assert json.loads(printed) == response.json()
    assert [item["slot"] for item in json.loads(printed)] == ["input", "params"]


async def test_site_transfers_says_when_there_are_none(cli: Cli) -> None:
    await cli.api.register_site("alice", SITE)

    assert (
        await cli.ok("alice", "site", "transfers", SITE)
        == f"no transfers are in flight at {SITE}\n"
    )


async def test_site_transfers_of_a_site_not_yours_is_an_error(cli: Cli, staged: Staged) -> None:
    result = await cli.run("bob", "site", "transfers", SITE)
    bad = await cli.run("alice", "site", "transfers", SITE, "--state", "done")

    assert result.returncode == 1
    assert result.stderr.strip() == f"error: 404 not_found: site '{SITE}' not found"
    assert result.stdout == ""
    assert bad.returncode == 1
    assert "422 invalid" in bad.stderr
    assert "query.state.0" in bad.stderr
