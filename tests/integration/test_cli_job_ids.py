"""Ids a person can use: the job commands take a unique prefix or suffix of an id, resolved
by the API among the caller's jobs, and name the matches when it is ambiguous; tables show
an id's random tail. The real command in a subprocess against the API on a loopback port."""

from __future__ import annotations

import json

import httpx

from lodestream.schemas.ids import short_id
from tests.fixtures.api import ApiHarness
from tests.integration.test_cli_jobs import USER, Cli, batch, cli

__all__ = ["cli"]  # the fixture


async def test_show_kill_and_reset_take_a_unique_prefix_or_suffix(cli: Cli) -> None:
    jobs_file = cli.tmp / "jobs.json"
    jobs_file.write_text(json.dumps({"jobs": batch(6)}))
    out = await cli.ok("job", "submit", "--file", str(jobs_file), "--wait")
    ids = [line.split()[0] for line in out.splitlines()]
    first, second = ids[0], ids[1]
    digits = first.replace("-", "")

    # The tail `lode job ls` shows, and a prefix long enough to be one job's only.
    table = await cli.ok("job", "ls")
    assert all(short_id(i) in table for i in ids)
    assert first not in table
    for part in (short_id(first), digits[:20], first[:23]):
        shown = await cli.ok("job", "show", part)
        assert json.loads(shown[: shown.index("\n}") + 2])["id"] == first, part

    # A prefix jobs created together share: not acted on, every match named, exit 1.
    shared = digits[:4]
    ambiguous = await cli.run("job", "show", shared)
    assert ambiguous.returncode == 1
    assert f"{shared} is part of the ids of 6 jobs" in ambiguous.stderr
    assert all(i in ambiguous.stderr for i in ids)
    assert "Traceback" not in ambiguous.stderr
    killed = await cli.run("job", "kill", shared)
    assert killed.returncode == 1
    assert await cli.jobs("--state", "KILLED") == []

    assert (await cli.ok("job", "kill", short_id(second))).strip() == f"{second}: KILLED"
    assert (await cli.ok("job", "reset", short_id(second))).strip() == f"{second}: READY"

    missing = await cli.run("job", "show", "0000ffff")
    assert missing.returncode == 1
    assert "no job of yours has an id beginning or ending 0000ffff" in missing.stderr
    bad = await cli.run("job", "show", "xyz")
    assert bad.returncode == 1
    assert "neither a job id nor 4+ hex digits of one" in bad.stderr


async def test_the_api_finds_ids_by_part_among_the_callers_jobs_only(
    api: ApiHarness, cli: Cli
) -> None:
    out = await cli.ok("job", "submit", "--site", "polaris", "--app", "sim", "--workdir", "w",
                       "-p", "n=1", "--wait")  # fmt: skip
    job_id = out.split()[0]
    tail = short_id(job_id)
    api.user("mallory")
    async with httpx.AsyncClient(base_url=cli.base_url) as http:

        async def find(user: str, **params: str) -> httpx.Response:
            headers = {"Authorization": f"Bearer {api.tokens[user]}"}
            return await http.get("/jobs", params=params, headers=headers)

        async def ids(user: str, **params: str) -> list[str]:
            answer = await find(user, **params)
            assert answer.status_code == 200, answer.text
            return [job["id"] for job in answer.json()["items"]]

        assert await ids(USER, id_suffix=tail) == [job_id]
        assert await ids(USER, id_suffix=tail.upper()) == [job_id]
        assert await ids(USER, id_prefix=job_id[:23]) == [job_id]
        assert await ids(USER, id_prefix=job_id[:23], id_suffix=tail) == [job_id]
        assert await ids("mallory", id_suffix=tail) == []
        headers = {"Authorization": f"Bearer {api.tokens[USER]}"}
        for part in (tail, job_id[:23], job_id):  # the dashboard's search by id
            found = await http.get("/ui/api/jobs", params={"job_id": part}, headers=headers)
            assert [job["id"] for job in found.json()] == [job_id], found.text
        short = await find(USER, id_suffix="abc")
        assert short.status_code == 422
        assert "at least 4 hex digits" in short.text
