"""``lode job submit|ls|kill|reset``, ``lode events``, ``lode app ls``, ``lode site ls``: the
real command in a subprocess against the API served on a loopback port."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from lodestream.schemas.resources import App, AppParameter, AppTransferSlot
from tests.fixtures.api import ApiHarness, served

USER = "alice"
SITES = ("polaris", "theta")
COMMAND_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Cli:
    api: ApiHarness
    base_url: str
    tmp: Path

    async def run(self, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "LODE_API_URL": self.base_url, "LODE_TOKEN": self.api.tokens[USER],
               "COLUMNS": "250"}  # fmt: skip
        argv = [sys.executable, "-m", "lodestream.client.cli.main", *args,
                "--state-dir", str(self.tmp / ".lode")]  # fmt: skip
        return await asyncio.to_thread(
            subprocess.run, argv, capture_output=True, text=True, env=env, input=stdin,
            timeout=COMMAND_TIMEOUT_S, check=False,
        )  # fmt: skip

    async def ok(self, *args: str, stdin: str = "") -> str:
        result = await self.run(*args, stdin=stdin)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    async def jobs(self, *filters: str) -> list[dict[str, Any]]:
        out = await self.ok("job", "ls", "--json", "--limit", "1000", *filters)
        return [json.loads(line) for line in out.splitlines()]

    async def usage_error(self, *args: str) -> str:
        """A bad command line: exit 2 and a message, no traceback."""
        result = await self.run(*args)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "Traceback" not in result.stderr
        return " ".join(result.stderr.replace("│", " ").split())


@pytest.fixture
async def cli(api: ApiHarness, tmp_path: Path) -> AsyncIterator[Cli]:
    api.user(USER)
    for site in SITES:
        await api.register_site(USER, site)
        await api.register_app(App(site=site, name="sim", parameters={"n": AppParameter()}))
    async with served(api) as base_url:
        yield Cli(api, base_url, tmp_path)


def batch(count: int, **tags: str) -> list[dict[str, Any]]:
    return [
        {"site": SITES[i % 2], "app": "sim", "workdir": f"r/{i}", "parameters": {"n": str(i)},
         "tags": {"i": str(i), **tags}}
        for i in range(count)
    ]  # fmt: skip


async def test_a_file_goes_in_chunks_and_the_filters_select_alike(cli: Cli) -> None:
    jobs_file = cli.tmp / "jobs.yaml"
    jobs_file.write_text(yaml.safe_dump({"jobs": batch(7, run="a") + batch(3, run="b")}))
    out = await cli.ok("job", "submit", "--file", str(jobs_file), "--chunk-size", "3", "--wait",
                       "--idempotency-key", "k1")  # fmt: skip
    assert len(out.splitlines()) == 10
    again = await cli.ok("job", "submit", "-f", str(jobs_file), "--chunk-size", "3",
                         "--idempotency-key", "k1")  # fmt: skip
    assert again.count("(duplicate)") == 10  # per-chunk keys: a rerun appends nothing

    assert len(await cli.jobs("--tag", "run:a")) == 7
    # "sim" has no preprocess hook and the jobs nothing to stage: they are created runnable.
    assert len(await cli.jobs("--tag", "run:a", "--site", "theta", "--state", "preprocessed")) == 3
    assert len(await cli.jobs("--since", "1h", "--app", "sim")) == 10
    assert await cli.jobs("--since", "2999-01-01T00:00:00") == []

    # kill by the same filter: asked first; "n" leaves everything as it was.
    refused = await cli.run("job", "kill", "--tag", "run:a", "--site", "theta", stdin="n\n")
    assert refused.returncode == 1
    assert "kill 3 jobs?" in refused.stderr
    assert await cli.jobs("--state", "KILLED") == []
    out = await cli.ok("job", "kill", "--tag", "run:a", "--site", "theta", stdin="y\n")
    assert "3 jobs KILLED" in out  # one request: POST /jobs/kill
    killed = {job["id"] for job in await cli.jobs("--state", "KILLED")}
    assert killed == {job["id"] for job in await cli.jobs("--tag", "run:a", "--site", "theta")}

    # reset by filter takes only the jobs it can (FAILED, KILLED) unless --state says more.
    out = await cli.ok("job", "reset", "--tag", "run:a", "--yes", "--reason", "again")
    assert "3 jobs READY" in out
    assert len(await cli.jobs("--state", "READY")) == 3
    # named jobs, no filter: as before, no question asked.
    one = next(iter(killed))
    assert (await cli.ok("job", "kill", one)).strip() == f"{one}: KILLED"


async def test_auto_site_from_the_command_line(cli: Cli) -> None:
    out = await cli.ok("job", "submit", "--site", "auto", "--strategy", "round_robin",
                       "--app", "sim", "--workdir", "w", "-p", "n=1", "--wait")  # fmt: skip
    job_id = out.split()[0]
    [job] = [j for j in await cli.jobs() if j["id"] == job_id]
    assert job["site"] == "polaris"  # first by name, both holding none
    created = json.loads((await cli.ok("events", "--job", job_id, "--json")).splitlines()[0])
    assert created["data"]["site_choice"]["strategy"] == "round_robin"
    assert set(created["data"]["site_choice"]["candidates"]) == set(SITES)
    bad = await cli.run("job", "submit", "--site", "auto", "--app", "nope", "--workdir", "w")
    assert bad.returncode == 1
    assert "none of your sites defines app 'nope'" in bad.stderr


async def test_events_tail_from_a_point_and_as_json(cli: Cli) -> None:
    response = await cli.api.submit(USER, batch(5))
    assert response.status_code == 201
    seqs = [job["seq"] for job in response.json()["jobs"]]

    tail = (await cli.ok("events", "-n", "2")).splitlines()
    assert tail[0].startswith("seq")
    assert [int(line.split()[0]) for line in tail[1:]] == seqs[-2:]
    since = [json.loads(line) for line in (await cli.ok("events", "--since", str(seqs[1]),
                                                          "--json")).splitlines()]  # fmt: skip
    assert [e["seq"] for e in since] == seqs[2:]
    at_theta = [
        json.loads(line)
        for line in (
            await cli.ok("events", "--since", "0", "--site", "theta", "--type", "created", "--json")
        ).splitlines()
    ]
    assert {e["site"] for e in at_theta} == {"theta"}
    assert len(at_theta) == 2


async def test_follow_prints_new_events_as_they_are_pushed(cli: Cli) -> None:
    env = {**os.environ, "LODE_API_URL": cli.base_url, "LODE_TOKEN": cli.api.tokens[USER]}
    # A poll interval far longer than the wait below: only the push feed can wake it.
    follower = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lodestream.client.cli.main", "events", "--follow", "--json",
        "--poll", "600", "--state-dir", str(cli.tmp / ".lode"),
        stdout=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    assert follower.stdout is not None
    try:
        for _ in range(2):  # the first submission may come before the feed is open
            response = await cli.api.submit(USER, batch(1))
            line = await asyncio.wait_for(follower.stdout.readline(), COMMAND_TIMEOUT_S)
            assert json.loads(line)["job_id"] == response.json()["jobs"][0]["id"]
    finally:
        follower.terminate()
        await follower.wait()


async def test_listings_print_json(cli: Cli) -> None:
    apps = json.loads(await cli.ok("app", "ls", "--json"))
    assert [(a["site"], a["name"]) for a in apps] == [(s, "sim") for s in SITES]
    assert "n" in (await cli.ok("app", "ls", "--site", "theta")).split("│")[-5]
    sites = json.loads(await cli.ok("site", "ls", "--json"))
    assert [s["name"] for s in sites] == list(SITES)
    assert json.loads(await cli.ok("queue", "ls", "--json")) == []


async def test_bad_filters_get_a_clear_message(cli: Cli) -> None:
    assert "'RUNING' is not a job state; states: CREATED" in await cli.usage_error(
        "job", "ls", "--state", "RUNING"
    )
    assert "'finishd' is not a job event type" in await cli.usage_error(
        "events", "--type", "finishd"
    )
    assert "give a duration (30s, 10m, 2h, 1d)" in await cli.usage_error(
        "job", "kill", "--since", "yesterday"
    )
    assert "name the jobs to reset, or select them" in await cli.usage_error("job", "reset")
    assert "No such option: --colour" in await cli.usage_error("job", "ls", "--colour", "x")
    assert "--strategy 'fastest'" in await cli.usage_error(
        "job", "submit", "--site", "auto", "--app", "sim", "--workdir", "w", "--strategy",
        "fastest",
    )  # fmt: skip


async def test_submit_flags_carry_types_transfers_packing_and_launch_options(cli: Cli) -> None:
    """Issue 31: transfers, packing, GPUs and launch options needed a job file; issue 32:
    `-p` values reach an app that declares types as those types."""
    await cli.api.register_app(App(
        site="polaris", name="typed", python=True,
        parameters={"steps": AppParameter(type="int"), "shape": AppParameter(type="list"),
                    "name": AppParameter(type="str"), "anything": AppParameter()},
        transfers={"raw": AppTransferSlot(direction="in", local_path="in/raw")},
    ))  # fmt: skip
    common = ("job", "submit", "--site", "polaris", "--app", "typed", "-p", "steps=5",
              "-p", "shape=[2, 3]", "-p", "name=007", "-p", "anything=007")  # fmt: skip
    out = await cli.ok(*common, "--gpus-per-rank", "1", "--threads-per-rank", "2",
                       "--node-packing-count", "4", "-L", "--cpu-bind=cores", "-L",
                       "--overlap", "--workdir", "flags/1")  # fmt: skip
    job_id = out.split()[0]
    (job,) = [j for j in await cli.jobs("--app", "typed") if j["id"] == job_id]
    # Declared types as declared; `any` is JSON where the text is JSON, text where not.
    assert job["parameters"] == {"steps": 5, "shape": [2, 3], "name": "007", "anything": "007"}
    resources = job["resources"]
    assert (resources["gpus_per_rank"], resources["threads_per_rank"]) == (1, 2)
    assert resources["node_packing_count"] == 4
    assert resources["launch_params"] == {"--cpu-bind": "cores", "--overlap": ""}

    # A transfer reaches the API as the job's slot: this site declared no location, so 422.
    refused = await cli.run(*common, "-T", "raw=aps:/data/scan1.h5", "--workdir", "flags/2")
    assert refused.returncode != 0
    assert "aps" in refused.stderr
    # What cannot be a job is a usage error here, before any request.
    assert "SLOT=LOCATION:PATH" in await cli.usage_error(*common, "-T", "raw:/no/slot")
    assert "declares steps as int" in await cli.usage_error(
        "job", "submit", "--site", "polaris", "--app", "typed", "-p", "steps=five"
    )
