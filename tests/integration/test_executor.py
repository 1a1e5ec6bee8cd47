"""``LodeExecutor`` against a real stack, a real site agent and a real pilot.

Every outcome is checked against the raw event list of the job (``/jobs/{id}/events``), not
against the executor's own fold: the future's value must be what the log says.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import as_completed
from pathlib import Path
from typing import Any, Final

import httpx
import pytest

from lodestream.client.config import ClientConfig
from lodestream.client.sdk import CallFailed, JobFailed, JobResult, LodeClient, LodeExecutor
from lodestream.infra.postgres.server import EmbeddedPostgres
from tests.support.processes import terminate
from tests.support.site import make_site_dir
from tests.support.stack import SITE_OWNERS, Stack, running_stack

pytestmark = pytest.mark.slow

ADA: Final = SITE_OWNERS["alpha"]
WAIT_S: Final = 120.0
SHELL_JOBS: Final = 1000


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, postgres_server: EmbeddedPostgres
) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("executor")
    with running_stack(root / "stack", postgres_server) as running:
        running.auth(ADA)
        agent_dir = make_site_dir(
            running.root / "sites" / "agent", "alpha", wss_url=running.websocket_url,
            ca_file=running.ca_file, seed_file=running.seed_files["alpha"],
            processing={"retry_budget": 1},
        ).directory  # fmt: skip
        with running.log_path("agent").open("ab") as log:
            agent = subprocess.Popen(
                [sys.executable, "-m", "lodestream.client.cli.main", "site", "start",
                 str(agent_dir)], stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        # One pilot for the module, that does not exit idle between tests.
        pilot_dir = make_site_dir(
            running.root / "sites" / "pilot-executor", "alpha", wss_url=running.websocket_url,
            ca_file=running.ca_file, seed_file=running.seed_files["alpha"], idle_ttl_s=900,
        ).directory  # fmt: skip
        with running.log_path("pilot-executor").open("ab") as log:
            pilot = subprocess.Popen(
                [sys.executable, "-m", "lodestream.client.cli.main", "launcher", "--site",
                 str(pilot_dir), "--wall-time-min", "30"], stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        try:
            _wait_for_apps(running)
            yield running
        finally:
            terminate(pilot)
            terminate(agent)


def _wait_for_apps(stack: Stack) -> None:
    deadline = time.monotonic() + WAIT_S
    with client(stack) as lode:
        while time.monotonic() < deadline:
            if {"square", "sleeper", "hello"} <= {a["name"] for a in lode.list_apps("alpha")}:
                return
            time.sleep(0.2)
    raise AssertionError("the site agent never registered its apps: " + stack.log_text("agent"))


def client(stack: Stack) -> LodeClient:
    return LodeClient(ClientConfig(api_url=stack.api_url, token=stack.tokens[ADA]))


def events(stack: Stack, job_id: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{stack.api_url}/jobs/{job_id}/events", headers=stack.auth(ADA))
    assert response.status_code == 200, response.text
    body: list[dict[str, Any]] = response.json()
    return body


def test_a_thousand_futures_settle_from_one_feed(stack: Stack) -> None:
    with LodeExecutor(client(stack), site="alpha") as lode:
        shell = [lode.submit("hello", who=f"n{i}") for i in range(SHELL_JOBS)]
        python = {i: lode.submit("square", str(i)) for i in range(5)}  # positional: `x`
        done = list(as_completed([*shell, *python.values()], timeout=WAIT_S))
    assert len(done) == SHELL_JOBS + 5
    for i, future in python.items():
        assert future.result() == {"square": i * i}
    sample = shell[::97]
    for future in sample:
        result = future.result()
        assert isinstance(result, JobResult)
        assert (result.state, result.return_code) == ("JOB_FINISHED", 0)
        assert future.job_id is not None
        history = events(stack, future.job_id)
        assert history[-1]["to_state"] == "JOB_FINISHED"
        greeting = Path(stack.root / "sites" / "pilot-executor" / "alpha" / "data")
        assert (greeting / result.workdir / "greeting.txt").exists()
    # The Python result is the log's: the value in the job's finishing event.
    job_id = python[3].job_id
    assert job_id is not None
    (finished,) = [e for e in events(stack, job_id) if e["type"] == "job.finished"]
    assert finished["data"]["run"]["result"] == {"square": 9}


def test_a_failing_python_app_raises_its_exception_here(stack: Stack) -> None:
    with LodeExecutor(client(stack), site="alpha") as lode:
        future = lode.submit("square", x="-4")
        with pytest.raises(JobFailed) as raised:
            future.result(timeout=WAIT_S)
    failed = raised.value
    assert failed.state == "FAILED"
    assert failed.remote is not None
    assert (failed.remote.type, failed.remote.message) == ("ValueError", "negative input -4")
    assert "raise ValueError" in failed.remote.traceback
    assert "ValueError: negative input -4" in str(failed)
    # The same, from the log: the last run's stderr is pyrun's traceback.
    assert future.job_id is not None
    runs = [e for e in events(stack, future.job_id) if e["type"] == "job.run_errored"]
    assert runs
    assert "negative input -4" in runs[-1]["data"]["stderr_tail"]


def test_cancel_kills_a_running_job(stack: Stack) -> None:
    with LodeExecutor(client(stack), site="alpha") as lode:
        future = lode.submit("sleeper", seconds="300")
        deadline = time.monotonic() + WAIT_S
        while not future.running():
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.1)
        assert future.cancel()
        assert future.cancelled()
        job_id = future.job_id
    assert job_id is not None
    deadline = time.monotonic() + WAIT_S
    while (history := events(stack, job_id))[-1]["to_state"] != "KILLED":  # once projected
        assert time.monotonic() < deadline, history
        time.sleep(0.2)
    assert "job.started" in [e["type"] for e in history]
    with client(stack) as api:
        assert api.job_result(job_id)["state"] == "KILLED"


def test_a_killed_client_re_attaches_and_every_future_settles(stack: Stack, tmp_path: Path) -> None:
    """A client SIGKILLed with 500 futures outstanding; a new one re-attaches by executor id."""
    script = textwrap.dedent(f"""
        import os, signal, sys
        from lodestream.client.config import ClientConfig
        from lodestream.client.sdk import LodeClient, LodeExecutor
        lode = LodeExecutor(LodeClient(ClientConfig(api_url={stack.api_url!r},
                                                    token={stack.tokens[ADA]!r})), site="alpha")
        futures = [lode.submit("sleeper", seconds="0.05") for _ in range(500)]
        while any(f.job_id is None for f in futures):
            pass
        print(lode.id, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=WAIT_S, check=False, env=os.environ.copy())  # fmt: skip
    assert done.returncode == -9, done.stderr
    executor_id = done.stdout.strip()
    with LodeExecutor(client(stack), site="alpha") as lode:
        futures = lode.attach(executor_id=executor_id)
        assert len(futures) == 500
        for future in as_completed(futures, timeout=WAIT_S):
            assert isinstance(future.result(), JobResult)
    for future in futures[::50]:
        assert future.job_id is not None
        assert events(stack, future.job_id)[-1]["to_state"] == "JOB_FINISHED"


def test_the_result_route(stack: Stack) -> None:
    with LodeExecutor(client(stack), site="alpha") as lode:
        ok = lode.submit("square", x="7")
        bad = lode.submit("square", x="-1")
        ok.result(timeout=WAIT_S)
        with pytest.raises(JobFailed):
            bad.result(timeout=WAIT_S)
    with client(stack) as api:
        assert ok.job_id is not None
        assert bad.job_id is not None
        good = api.job_result(ok.job_id)
        assert (good["state"], good["final"], good["result"]) == (
            "JOB_FINISHED",
            True,
            {"square": 49},
        )
        failed = api.job_result(bad.job_id)
        assert failed["state"] == "FAILED"
        assert failed["error"]["type"] == "ValueError"
        both = api.job_results([ok.job_id, bad.job_id, "00000000-0000-7000-8000-000000000000"])
        assert {r["state"] for r in both["results"]} == {"JOB_FINISHED", "FAILED"}
        assert both["missing"] == ["00000000-0000-7000-8000-000000000000"]
    # Another user's job is not found.
    other = httpx.get(f"{stack.api_url}/jobs/{ok.job_id}/result", headers=stack.auth("eve"))
    assert other.status_code == 404


def test_map_with_a_chunksize_puts_that_many_calls_in_a_job(stack: Stack) -> None:
    """Ten calls, four a job: three jobs on the log, each finishing with one outcome per
    call, and the values come back in order."""
    tag = {"case": "map-chunks"}
    with LodeExecutor(client(stack), site="alpha") as lode:
        values = list(lode.map("square", [str(i) for i in range(10)], chunksize=4, tags=tag,
                               timeout=WAIT_S))  # fmt: skip
    assert values == [{"square": i * i} for i in range(10)]
    with client(stack) as api:
        jobs = list(api.list_jobs(tag=["case:map-chunks"]))
    assert len(jobs) == 3
    sizes = []
    for job in jobs:
        (finished,) = [e for e in events(stack, str(job["id"])) if e["type"] == "job.finished"]
        outcomes = finished["data"]["run"]["result"]
        assert all(o["ok"] for o in outcomes)
        sizes.append(len(outcomes))
    assert sorted(sizes) == [2, 4, 4]


def test_a_call_that_raises_fails_alone_where_the_iterator_reaches_it(stack: Stack) -> None:
    with LodeExecutor(client(stack), site="alpha") as lode:
        results = lode.map("square", ["1", "-2", "3"], chunksize=3, timeout=WAIT_S)
        assert next(results) == {"square": 1}
        with pytest.raises(CallFailed) as raised:
            next(results)
    failed = raised.value
    assert failed.index == 1
    assert (failed.remote.type, failed.remote.message) == ("ValueError", "negative input -2")
    assert "raise ValueError" in failed.remote.traceback
    # The job is fine: it finished, with the third call's value beside the second's error.
    history = events(stack, failed.job_id)
    assert history[-1]["to_state"] == "JOB_FINISHED"
    outcomes = history[-1]["data"]["run"]["result"]
    assert [o["ok"] for o in outcomes] == [True, False, True]
    assert outcomes[2]["result"] == {"square": 9}


def test_calls_are_checked_by_the_api_like_parameters(stack: Stack) -> None:
    """A call without a required parameter or with one the app lacks, a shell app given
    calls, calls beside parameters: 422, and nothing is created (types: test_api_submit)."""
    url = f"{stack.api_url}/jobs"
    base = {"site": "alpha", "workdir": "calls/bad", "tags": {"case": "bad-calls"}}
    bad = [
        {**base, "app": "square", "calls": [{"x": "1"}, {}]},
        {**base, "app": "square", "calls": [{"x": "1"}, {"y": "2"}]},
        {**base, "app": "hello", "calls": [{"who": "a"}]},
        {**base, "app": "square", "calls": [{"x": "1"}], "parameters": {"x": "2"}},
    ]
    for job in bad:
        response = httpx.post(url, headers=stack.auth(ADA), json={"jobs": [job]}, timeout=30)
        assert response.status_code == 422, (job, response.text)
    messages = [
        httpx.post(url, headers=stack.auth(ADA), json={"jobs": [job]}, timeout=30).text
        for job in bad[:3]
    ]
    assert "call 1 lacks required parameter 'x'" in messages[0]
    assert "call 1 has no parameter 'y'" in messages[1]
    assert "calls are for Python functions" in messages[2]
    with client(stack) as api:
        assert list(api.list_jobs(tag=["case:bad-calls"])) == []
