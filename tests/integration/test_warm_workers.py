"""Warm Python workers for real: a template, its forked workers, and jobs that misbehave.

The pool is driven as the pilot drives it (``start`` a job, poll its task), with real
processes and the pyrun result files the pilot reads; what the pilot then appends is
checked end to end in ``test_launcher_warm.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import textwrap
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from lodestream.agents.launcher.warm import WarmPool, WarmTask
from lodestream.agents.site.apps.render import PYRUN_RESULT, PyCall
from lodestream.agents.site.settings import PythonWorkerSettings
from lodestream.platform_adapters.compute.base import NodePlacement
from lodestream.platform_adapters.launchers.base import TaskSpec
from lodestream.platform_adapters.packing import Allocation

APPS = """
import os
import sys
import time

from lodestream.agents.site.apps import ApplicationDefinition


class Who(ApplicationDefinition):
    name = "who"

    def run(self) -> dict[str, object]:
        return {"pid": os.getpid(), "cwd": os.getcwd(), "x": os.environ.get("X"),
                "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "version": VERSION}


class Raises(ApplicationDefinition):
    name = "raises"

    def run(self) -> None:
        raise ValueError("bad input")


class Forever(ApplicationDefinition):
    name = "forever"

    def run(self) -> None:
        while True:
            time.sleep(0.01)


class Exits(ApplicationDefinition):
    name = "exits"

    def run(self) -> None:
        os._exit(7)


class Crashes(ApplicationDefinition):
    name = "crashes"

    def run(self) -> None:
        os.kill(os.getpid(), 9)


class Hog(ApplicationDefinition):
    name = "hog"

    def run(self) -> int:
        return len(bytearray(2 * 1024**3))


class Chatty(ApplicationDefinition):
    name = "chatty"

    def run(self, lines: str) -> int:
        for i in range(int(lines)):
            print(f"line {i}")
        print("to stderr", file=sys.stderr)
        os.write(1, b"raw\\n")
        return int(lines)


class Meddles(ApplicationDefinition):
    name = "meddles"

    def run(self) -> None:
        os.environ["X"] = "meddled"
        os.chdir("/")
        sys.stdout = open(os.devnull, "w")
"""


def write_apps(apps: Path, version: int) -> None:
    (apps / "warm.py").write_text(textwrap.dedent(APPS) + f"\nVERSION = {version}\n")


@pytest.fixture
def apps(tmp_path: Path) -> Path:
    apps = tmp_path / "apps"
    apps.mkdir()
    write_apps(apps, 1)
    return apps


async def open_pool(tmp_path: Path, apps: Path, size: int = 1, **settings: Any) -> WarmPool:
    pool = WarmPool(apps, PythonWorkerSettings(**settings), env=dict(os.environ),
                    cwd=tmp_path, size=size)  # fmt: skip
    await pool.open()
    assert pool.broken is None
    return pool


@pytest.fixture
async def pool(tmp_path: Path, apps: Path) -> AsyncIterator[WarmPool]:
    pool = await open_pool(tmp_path, apps, time_limit_s=3)
    yield pool
    pool.close()


async def start(
    pool: WarmPool, tmp_path: Path, app: str, params: dict[str, str] | None = None,
    gpus: tuple[str, ...] = (), env: dict[str, str] | None = None,
) -> WarmTask:  # fmt: skip
    job = str(uuid.uuid4())
    workdir = tmp_path / "data" / job
    placement = NodePlacement(hostname="localhost", cpu_ids=(0,), gpu_ids=gpus)
    spec = TaskSpec(job_id=job, script="", workdir=workdir, env=env or {},
                    allocation=Allocation(job, (placement,)), stdout_path=workdir / "job.out",
                    stderr_path=workdir / "job.err")  # fmt: skip
    call = PyCall(app=app, params_json=json.dumps(params or {}), env={"LODE_JOB_ID": job})
    return await pool.start(spec, call)


def result(task: WarmTask) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((task.spec.workdir / PYRUN_RESULT).read_text())
    return doc


async def test_a_job_runs_in_its_workdir_with_its_environment_and_its_value_comes_back(
    pool: WarmPool, tmp_path: Path
) -> None:
    task = await start(pool, tmp_path, "who", env={"X": "mine"})
    assert task.wait(10) == 0
    value = result(task)["result"]
    assert (value["pid"], value["cwd"], value["x"]) == (task.pid, str(task.spec.workdir), "mine")
    again = await start(pool, tmp_path, "who")
    assert again.wait(10) == 0
    assert result(again)["result"]["pid"] == task.pid  # the same warm worker
    assert result(again)["result"]["x"] is None


async def test_an_exception_comes_back_with_its_traceback(pool: WarmPool, tmp_path: Path) -> None:
    task = await start(pool, tmp_path, "raises")
    assert task.wait(10) == 1
    doc = result(task)
    assert doc["error"] == "ValueError: bad input"
    assert doc["traceback"].startswith("Traceback (most recent call last):")
    assert "warm.py" in doc["traceback"]


async def test_a_job_past_its_time_limit_is_killed_and_its_worker_replaced(
    pool: WarmPool, tmp_path: Path
) -> None:
    task = await start(pool, tmp_path, "forever")
    assert task.wait(30) == -signal.SIGKILL
    assert "killed by SIGKILL (the job ran past its time limit of 3 s)" in task.stderr_tail()
    assert "peak RSS" in task.stderr_tail()
    after = await start(pool, tmp_path, "who")
    assert after.wait(10) == 0
    assert after.pid != task.pid


@pytest.mark.parametrize(("app", "code", "how"), [
    ("exits", 7, "exited with status 7"), ("crashes", -9, "was killed by SIGKILL"),
])  # fmt: skip
async def test_a_worker_that_dies_fails_only_its_job_with_the_cause(
    pool: WarmPool, tmp_path: Path, app: str, code: int, how: str
) -> None:
    task = await start(pool, tmp_path, app)
    assert task.wait(10) == code
    assert how in task.stderr_tail()
    assert not (task.spec.workdir / PYRUN_RESULT).exists()
    after = await start(pool, tmp_path, "who")
    assert after.wait(10) == 0
    assert after.pid != task.pid


async def test_a_job_over_the_memory_limit_fails_and_its_worker_is_recycled(
    tmp_path: Path, apps: Path
) -> None:
    pool = await open_pool(tmp_path, apps, memory_limit_mb=512)
    try:
        task = await start(pool, tmp_path, "hog")
        assert task.wait(30) == 1
        assert result(task)["error"].startswith("MemoryError")
        after = await start(pool, tmp_path, "who")
        assert after.wait(10) == 0
        assert after.pid != task.pid
    finally:
        pool.close()


async def test_output_goes_to_the_job_files_and_state_does_not_leak(
    pool: WarmPool, tmp_path: Path
) -> None:
    chatty = await start(pool, tmp_path, "chatty", {"lines": "20000"})
    assert chatty.wait(30) == 0
    out = (chatty.spec.workdir / "job.out").read_text().splitlines()
    assert out.count("raw") == 1
    assert [line for line in out if line.startswith("line")] == [f"line {i}" for i in range(20000)]
    assert (chatty.spec.workdir / "job.err").read_text() == "to stderr\n"
    meddles = await start(pool, tmp_path, "meddles")
    assert meddles.wait(10) == 0
    after = await start(pool, tmp_path, "chatty", {"lines": "1"})
    assert after.wait(10) == 0
    assert after.pid == meddles.pid
    assert (after.spec.workdir / "job.out").read_text() == "line 0\nraw\n"
    who = await start(pool, tmp_path, "who")
    assert who.wait(10) == 0
    assert (result(who)["result"]["cwd"], result(who)["result"]["x"]) == (
        str(who.spec.workdir),
        None,
    )


async def test_a_terminated_job_takes_its_worker_with_it(pool: WarmPool, tmp_path: Path) -> None:
    task = await start(pool, tmp_path, "forever")
    await asyncio.sleep(0.2)
    task.terminate(grace_s=2.0)
    assert task.wait(10) == -signal.SIGTERM
    after = await start(pool, tmp_path, "who")
    assert after.wait(10) == 0
    assert after.pid != task.pid


async def test_a_worker_is_recycled_after_max_jobs(tmp_path: Path, apps: Path) -> None:
    pool = await open_pool(tmp_path, apps, max_jobs=3)
    try:
        pids = []
        for _ in range(7):
            task = await start(pool, tmp_path, "who")
            assert task.wait(10) == 0
            pids.append(task.pid)
        assert [pids.index(p) for p in pids] == [0, 0, 0, 3, 3, 3, 6]
    finally:
        pool.close()


async def test_a_worker_bound_to_a_gpu_runs_only_that_gpus_jobs(tmp_path: Path, apps: Path) -> None:
    pool = await open_pool(tmp_path, apps, size=3)
    try:
        seen: dict[tuple[str, ...], set[int]] = {}
        for gpus in [("1",), (), ("1",), ("0", "2"), ()]:
            task = await start(pool, tmp_path, "who", gpus=gpus)
            assert task.wait(10) == 0
            seen.setdefault(gpus, set()).add(task.pid)
            assert result(task)["result"]["gpus"] == (",".join(gpus) or None)
    finally:
        pool.close()
    assert len(seen[("1",)]) == 1  # its second job found it idle
    assert not seen[("1",)] & (seen[()] | seen[("0", "2")])


async def test_an_app_edited_while_its_workers_run_reaches_new_workers(
    tmp_path: Path, apps: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("lodestream.agents.launcher.warm.pool.APPS_CHECK_S", 0.0)
    pool = await open_pool(tmp_path, apps, size=2)
    try:
        running = await start(pool, tmp_path, "forever")
        write_apps(apps, 2)
        task = await start(pool, tmp_path, "who")
        assert task.wait(20) == 0
        assert result(task)["result"]["version"] == 2
        assert running.poll() is None  # the old worker's job goes on
        running.kill()
        assert running.wait(10) == -signal.SIGKILL
    finally:
        pool.close()


async def test_an_app_that_asks_for_a_process_is_not_run_warm(apps: Path, tmp_path: Path) -> None:
    from lodestream.agents.site.apps import load_apps  # noqa: PLC0415

    (apps / "cold.py").write_text(textwrap.dedent('''
        from lodestream.agents.site.apps import ApplicationDefinition

        class Cold(ApplicationDefinition):
            name = "cold"
            isolation = "process"

            def run(self) -> None:
                return None
    '''))  # fmt: skip
    loaded = load_apps(apps)
    pool = WarmPool(apps, PythonWorkerSettings(), env={}, cwd=tmp_path, size=1)
    assert pool.runs(loaded["who"])
    assert not pool.runs(loaded["cold"])


async def test_a_template_that_dies_is_replaced_at_the_next_job(
    pool: WarmPool, tmp_path: Path
) -> None:
    first = await start(pool, tmp_path, "who")
    assert first.wait(10) == 0
    template = pool._template
    assert template is not None
    template.proc.kill()
    template.proc.wait()
    after = await start(pool, tmp_path, "who")
    assert after.wait(10) == 0
    assert after.pid != first.pid
    assert pool._template is not template
