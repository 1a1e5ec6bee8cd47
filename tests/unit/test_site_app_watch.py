"""Apps reload without a restart (``agents/site/appwatch.py``): an edited or new file is
loaded and published with a new version; a broken one keeps the last good version and is
reported with ``app.load_failed``; fixing it announces the apps again, clearing the error.

The log is a list that records appends (the publisher only appends); the directory is real.
"""

from __future__ import annotations

import asyncio
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from lodestream.agents.site.apps import load_apps
from lodestream.agents.site.appwatch import AppWatcher, snapshot
from lodestream.agents.site.registry import AppPublisher
from lodestream.eventlog.append import Appended
from lodestream.schemas.envelope import Event
from lodestream.schemas.events import AppLoadFailed, AppRegistered, AppRemoved, AppUpdated

SITE = "alpha"
SIM = """
from lodestream.agents.site.apps import ApplicationDefinition

class Sim(ApplicationDefinition):
    command_template = "sim --steps {{ steps }}"
    parameters = {"steps": {"type": "int"}}
"""


class Log:
    def __init__(self) -> None:
        self.events: list[Event] = []

    async def append(self, event: Event, *, expect: int | None) -> Appended:
        self.events.append(event)
        return Appended(event, len(self.events), duplicate=False)

    def take(self) -> list[tuple[str, Any]]:
        taken = [(e.type, e.data) for e in self.events]
        self.events.clear()
        return taken


def write(apps: Path, name: str, source: str) -> None:
    path = apps / name
    path.write_text(textwrap.dedent(source).lstrip("\n"))
    stat = path.stat()  # a later mtime even on a coarse clock: the watcher compares them
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9 * (len(source) % 7 + 1)))


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Log, AppWatcher]:
    apps_dir = tmp_path / "apps"
    apps_dir.mkdir()
    write(apps_dir, "sim.py", SIM)
    log = Log()
    publisher = AppPublisher(log, SITE, tmp_path / "log" / "published-apps.json")  # type: ignore[arg-type]
    apps = load_apps(apps_dir)
    asyncio.run(publisher.publish(apps))
    return apps_dir, log, AppWatcher(apps_dir, apps, publisher, period_s=0.01)


async def test_an_edited_file_is_published_as_a_new_version(
    setup: tuple[Path, Log, AppWatcher],
) -> None:
    apps_dir, log, watcher = setup
    ((registered, first),) = log.take()
    assert registered == "app.registered"
    assert not await watcher.check()  # nothing changed
    write(apps_dir, "sim.py", SIM.replace("sim --steps", "sim2 --steps"))
    assert await watcher.check()
    ((updated, second),) = log.take()
    assert updated == "app.updated"
    assert second.version != first.version
    assert second.parameters == first.parameters
    write(apps_dir, "more.py", SIM.replace("Sim", "More"))
    await watcher.check()
    assert [(t, d.name) for t, d in log.take()] == [("app.registered", "More")]


async def test_a_broken_edit_keeps_the_last_good_version_and_says_why(
    setup: tuple[Path, Log, AppWatcher],
) -> None:
    apps_dir, log, watcher = setup
    log.take()
    good = watcher._apps["Sim"]
    write(apps_dir, "sim.py", SIM + "\nraise RuntimeError('half-edited')\n")
    await watcher.check()
    ((failed, data),) = log.take()
    assert failed == "app.load_failed"
    assert (data.source, data.line, data.apps) == ("sim.py", 7, ("Sim",))
    assert data.message == "RuntimeError: half-edited"
    assert watcher._apps["Sim"] is good  # jobs go on with the last good definition
    write(apps_dir, "sim.py", SIM)  # back as it was: the same version, announced again
    await watcher.check()
    ((updated, data),) = log.take()
    assert (updated, data.name) == ("app.updated", "Sim")
    write(apps_dir, "sim.py", SIM + "\n# a comment\n")
    await watcher.check()
    assert [t for t, _ in log.take()] == ["app.updated"]


async def test_a_removed_file_removes_its_apps(setup: tuple[Path, Log, AppWatcher]) -> None:
    apps_dir, log, watcher = setup
    log.take()
    (apps_dir / "sim.py").unlink()
    await watcher.check()
    assert [(t, d.name) for t, d in log.take()] == [("app.removed", "Sim")]
    assert watcher._apps == {}


async def test_the_watcher_runs_until_stopped(setup: tuple[Path, Log, AppWatcher]) -> None:
    apps_dir, log, watcher = setup
    log.take()
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop))
    write(apps_dir, "sim.py", SIM + "\n# edited\n")
    for _ in range(500):
        if log.events:
            break
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert [type(e) for e in log.events] == [AppUpdated]
    assert snapshot(apps_dir).keys() == {"sim.py"}


def test_the_event_types_are_the_apps() -> None:
    assert {AppLoadFailed.event_type, AppRegistered.event_type, AppRemoved.event_type} == {
        "app.load_failed", "app.registered", "app.removed",
    }  # fmt: skip
