"""Apps reload without a restart: the site agent watches its ``apps/`` directory.

Every ``period_s`` it compares the files' modification times and sizes with the last look;
on a change it loads the directory again. When that works, the agent's apps (one dict,
shared with processing) become the new ones and the publisher announces what changed
(``app.updated`` with a new version, ``app.registered``, ``app.removed``). When a file
fails, nothing changes at the site: its apps keep their last good version, and
``app.load_failed`` names the file, the line and the reason, which ``lode app ls`` shows
beside them until the file loads again.

Jobs started after a reload render with the new definitions; a Python-function app's
``run()`` is read from its file by each job's interpreter (or warm worker) as it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Final

from lodestream.agents.site.apps import ApplicationDefinition, load_apps
from lodestream.agents.site.apps.errors import AppLoadError
from lodestream.agents.site.apps.loader import source_file
from lodestream.agents.site.registry import AppPublisher

log = logging.getLogger(__name__)

POLL_S: Final = 2.0
Snapshot = dict[str, tuple[int, int]]


def snapshot(apps_dir: Path) -> Snapshot:
    """Each ``*.py`` file of ``apps_dir`` by name: its modification time (ns) and size."""
    files: Snapshot = {}
    for path in apps_dir.glob("*.py"):
        with contextlib.suppress(OSError):  # removed between the listing and the stat
            stat = path.stat()
            files[path.name] = (stat.st_mtime_ns, stat.st_size)
    return files


class AppWatcher:
    def __init__(
        self,
        apps_dir: Path,
        apps: dict[str, type[ApplicationDefinition]],
        publisher: AppPublisher,
        *,
        period_s: float = POLL_S,
    ) -> None:
        self._dir = apps_dir
        self._apps = apps  # the agent's own dict: updated in place
        self._publisher = publisher
        self._period_s = period_s
        self._seen = snapshot(apps_dir)
        self.reloads = 0
        self.failures = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Look every ``period_s`` until ``stop``; a failed look is logged, never fatal."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._period_s)
                return
            try:
                await self.check()
            except Exception:
                log.exception("apps: could not reload %s; trying again", self._dir)

    async def check(self) -> bool:
        """Reload if a file changed since the last look; whether one had."""
        now = await asyncio.to_thread(snapshot, self._dir)
        if now == self._seen:
            return False
        self._seen = now
        await self.reload()
        return True

    async def reload(self) -> None:
        try:
            # Importing runs the site author's code: not on the event loop's thread.
            loaded = await asyncio.to_thread(load_apps, self._dir)
        except AppLoadError as exc:
            self.failures += 1
            names = [name for name, app in self._apps.items() if source_file(app) == exc.path]
            log.warning("apps: %s; %s keep their last good version", exc, names or "no apps")
            await self._publisher.load_failed(exc, names)
            return
        self._apps.clear()
        self._apps.update(loaded)
        self.reloads += 1
        for name, action in (await self._publisher.publish(loaded)).items():
            log.info("app %s %s", name, action)
