"""Issue 32's data-model items against a real stack, a real site agent and a real pilot:
JSON parameters reach a Python app's ``run()`` typed; an app file edited while the agent
runs is published as a new version, and a broken edit keeps the old one with its error
shown; the async client and the typed reads against the API."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from lodestream.client.config import ClientConfig
from lodestream.client.errors import ApiError
from lodestream.client.sdk import App, AsyncLodeClient, LodeClient, LodeExecutor
from lodestream.infra.postgres.server import EmbeddedPostgres
from tests.support.processes import terminate
from tests.support.site import make_site_dir
from tests.support.stack import SITE_OWNERS, Stack, running_stack

pytestmark = pytest.mark.slow

ADA: Final = SITE_OWNERS["alpha"]
WAIT_S: Final = 120.0
TYPED = '''
from lodestream.agents.site.apps import ApplicationDefinition


class Typed(ApplicationDefinition):
    """Says what it was given, and as what."""

    name = "typed"
    parameters = {"steps": {"type": "int"}}

    def run(self, steps, xs, opts, scale=0.5):
        return {name: [type(value).__name__, value] for name, value in
                {"steps": steps, "xs": xs, "opts": opts, "scale": scale}.items()}
'''


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, postgres_server: EmbeddedPostgres
) -> Iterator[tuple[Stack, Path]]:
    root = tmp_path_factory.mktemp("sdk-json-apps")
    with running_stack(root / "stack", postgres_server) as running:
        running.auth(ADA)
        dirs = {
            name: make_site_dir(
                running.root / "sites" / name, "alpha", wss_url=running.websocket_url,
                ca_file=running.ca_file, seed_file=running.seed_files["alpha"], idle_ttl_s=900,
            ).directory
            for name in ("agent", "pilot")
        }  # fmt: skip
        for directory in dirs.values():
            (directory / "apps" / "typed.py").write_text(TYPED)
        commands = {
            "agent": ["site", "start", str(dirs["agent"])],
            "pilot": ["launcher", "--site", str(dirs["pilot"]), "--wall-time-min", "30"],
        }
        processes = []
        for name, command in commands.items():
            with running.log_path(name).open("ab") as log:
                processes.append(subprocess.Popen(
                    [sys.executable, "-m", "lodestream.client.cli.main", *command],
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                ))  # fmt: skip
        try:
            eventually(running, lambda apps: "typed" in apps, "the agent registered typed")
            yield running, dirs["agent"]
        finally:
            for process in processes:
                terminate(process)


def client(stack: Stack) -> LodeClient:
    return LodeClient(ClientConfig(api_url=stack.api_url, token=stack.tokens[ADA]))


def eventually(stack: Stack, ok: Callable[[dict[str, App]], bool], what: str) -> dict[str, App]:
    deadline = time.monotonic() + WAIT_S
    with client(stack) as lode:
        while time.monotonic() < deadline:
            apps = {app.name: app for app in lode.apps("alpha")}
            if ok(apps):
                return apps
            time.sleep(0.2)
    raise AssertionError(f"never: {what}\n" + stack.log_text("agent"))


def test_json_parameters_reach_run_typed(stack: tuple[Stack, Path]) -> None:
    running, _ = stack
    with LodeExecutor(client(running), site="alpha") as lode:
        future = lode.submit("typed", steps=5, xs=[1, "a"], opts={"deep": {"none": None}})
        assert future.result(timeout=WAIT_S) == {
            "steps": ["int", 5], "xs": ["list", [1, "a"]],
            "opts": ["dict", {"deep": {"none": None}}], "scale": ["float", 0.5],
        }  # fmt: skip
    job = {"site": "alpha", "app": "typed", "workdir": "typed/bad",
           "parameters": {"steps": "5", "xs": [], "opts": {}}}  # fmt: skip
    with client(running) as lode, pytest.raises(ApiError) as refused:
        lode.submit_jobs([job])
    assert refused.value.status == 422
    assert "parameter 'steps' must be an int, not a string" in refused.value.message


def test_an_edited_app_file_is_published_and_a_broken_one_keeps_its_version(
    stack: tuple[Stack, Path],
) -> None:
    running, agent_dir = stack
    path = agent_dir / "apps" / "typed.py"
    first = eventually(running, lambda apps: "typed" in apps, "typed")["typed"]
    assert len(first.version) == 16
    assert first.parameters["steps"]["type"] == "int"
    path.write_text(TYPED.replace("Says what it was given", "Says what it got"))
    edited = eventually(
        running, lambda apps: apps["typed"].version != first.version, "a new version"
    )["typed"]
    assert (edited.description, edited.error) == ("Says what it got, and as what.", None)
    path.write_text(TYPED + "\nraise RuntimeError('half-edited')\n")
    broken = eventually(running, lambda apps: apps["typed"].error is not None, "the error")
    assert broken["typed"].version == edited.version
    assert broken["typed"].error == "typed.py:15: RuntimeError: half-edited"
    path.write_text(TYPED)
    fixed = eventually(running, lambda apps: apps["typed"].error is None, "the error cleared")
    assert fixed["typed"].version == first.version


def test_the_async_client_against_the_api(stack: tuple[Stack, Path]) -> None:
    running, _ = stack

    async def scenario() -> dict[str, Any]:
        config = ClientConfig(api_url=running.api_url, token=running.tokens[ADA])
        async with AsyncLodeClient(config) as lode:
            job = {"site": "alpha", "app": "typed", "workdir": "typed/async",
                   "parameters": {"steps": 2, "xs": [], "opts": {}}}  # fmt: skip
            submitted = await lode.submit_jobs([job], wait=True)
            job_id = submitted["jobs"][0]["id"]
            typed_job = await lode.job(job_id)
            listed = [j.id async for j in lode.jobs(app="typed")]
            assert typed_job.id in listed
            assert typed_job.parameters == job["parameters"]
            assert await lode.resolve_job_id(job_id[-6:]) == job_id
            with pytest.raises(ApiError) as missing:
                await lode.get_batch_job("00000000-0000-7000-8000-000000000000")
            assert missing.value.status == 404
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:
                result = await lode.result(job_id)
                if result.final:
                    return result.model_dump()
                await asyncio.sleep(0.2)
        raise AssertionError("the job never ended")

    result = asyncio.run(scenario())
    assert result["state"] == "JOB_FINISHED"
    assert result["result"]["steps"] == ["int", 2]
