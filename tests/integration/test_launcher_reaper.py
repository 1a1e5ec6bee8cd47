"""The pilot's reaper: every task's end resolves its future once, with no descriptor left open."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from lodestream.agents.launcher.tasks import Reaper
from lodestream.platform_adapters.launchers import FakeLauncher, FakeOutcome, LocalLauncher
from tests.integration.test_platform_launchers import make_spec

WAIT_S = 30.0


def open_fds() -> int:
    return sum(1 for _ in Path("/proc/self/fd").iterdir())


async def run_reaper(reaper: Reaper) -> tuple[asyncio.Event, asyncio.Task[None]]:
    stop = asyncio.Event()
    return stop, asyncio.create_task(reaper.run(stop))


async def test_many_short_local_tasks_resolve_with_their_status(tmp_path: Path) -> None:
    reaper = Reaper()
    stop, loop = await run_reaper(reaper)
    before = open_fds()
    launcher = LocalLauncher()
    tracked = []
    for i in range(200):
        (tmp_path / str(i)).mkdir()
        spec = make_spec(tmp_path / str(i), "exit 9", job_id=f"job-{i}")
        argv = ("/bin/true",) if i % 2 else ("/bin/false",)
        tracked.append(reaper.track(launcher.start(replace(spec, argv=argv))))
    codes = await asyncio.wait_for(asyncio.gather(*(t.done for t in tracked)), WAIT_S)
    assert codes == [1 if i % 2 == 0 else 0 for i in range(200)]
    assert len(reaper) == 0
    assert open_fds() == before  # every pidfd closed
    stop.set()
    await asyncio.wait_for(loop, WAIT_S)


async def test_terminate_escalation_still_ends_a_task_that_ignores_sigterm(
    tmp_path: Path,
) -> None:
    reaper = Reaper()
    stop, loop = await run_reaper(reaper)
    spec = make_spec(tmp_path, "trap '' TERM\nsleep 60 & wait\n")
    task = LocalLauncher().start(spec)
    tracked = reaper.track(task)
    await asyncio.sleep(0.2)
    task.terminate(grace_s=0.3)
    assert await asyncio.wait_for(tracked.done, WAIT_S) == -9
    stop.set()
    await asyncio.wait_for(loop, WAIT_S)


async def test_tasks_without_an_exit_descriptor_are_polled(tmp_path: Path) -> None:
    reaper = Reaper()
    stop, loop = await run_reaper(reaper)
    task = FakeLauncher(FakeOutcome(returncode=3, duration_s=0.05)).start(make_spec(tmp_path, ""))
    assert task.exit_fd() is None
    assert await asyncio.wait_for(reaper.track(task).done, WAIT_S) == 3
    stop.set()
    await asyncio.wait_for(loop, WAIT_S)


async def test_stopping_closes_descriptors_of_tasks_still_running(tmp_path: Path) -> None:
    reaper = Reaper()
    stop, loop = await run_reaper(reaper)
    before = open_fds()
    task = LocalLauncher().start(make_spec(tmp_path, "sleep 60"))
    reaper.track(task)
    assert open_fds() == before + 1
    task.kill()
    stop.set()
    await asyncio.wait_for(loop, WAIT_S)  # runs until the killed task is reaped
    assert open_fds() == before
