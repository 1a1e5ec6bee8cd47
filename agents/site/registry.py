"""Publishes the site's ApplicationDefinitions as app.registered / updated / removed events.

The API can only reference an app by name; this is how it learns the names,
their parameters and which hooks they define. What was last published (each
app's version, and which apps' files failed to load since) is kept in
``<site>/log/published-apps.json`` so an unchanged app is not re-announced at
every start, and an app whose file loads again is, to clear its error.
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path

from lodestream.agents.site.apps import ApplicationDefinition
from lodestream.agents.site.apps.errors import AppLoadError
from lodestream.agents.site.apps.loader import app_version, to_app_model
from lodestream.eventlog import EventLog
from lodestream.eventlog.kernel import Append, commit_one
from lodestream.schemas.events import AppLoadFailed, AppRegistered, AppRemoved, AppUpdated
from lodestream.schemas.events.app import MAX_LOAD_ERROR, AppLoadFailedData, AppRemovedData
from lodestream.schemas.ids import derived_id

log = logging.getLogger(__name__)
# The state file's entry of the apps whose file failed to load (an app name cannot be it).
_FAILED = " failed"


class AppPublisher:
    def __init__(self, log_: EventLog, site: str, state_file: Path) -> None:
        self._log = log_
        self._site = site
        self._state_file = state_file

    @property
    def actor(self) -> str:
        return f"site:{self._site}"

    async def publish(self, apps: dict[str, type[ApplicationDefinition]]) -> dict[str, str]:
        """Bring the log in line with ``apps``; return what changed (name → action)."""
        published = self._load_state()
        failed = set(published.pop(_FAILED, "").split())
        changes: dict[str, str] = {}
        for name, app in sorted(apps.items()):
            version = app_version(app)
            if published.get(name) == version and name not in failed:
                continue
            changes[name] = await self._announce(app, first=name not in published)
            published[name] = version
        for name in sorted(set(published) - set(apps)):
            removed = AppRemoved.create(
                site=self._site, aggregate_id=self._aggregate(name), actor=self.actor,
                data=AppRemovedData(name=name),
            )  # fmt: skip
            await self._log.append(removed, expect=None)
            del published[name]
            changes[name] = "removed"
        self._save_state(published)
        return changes

    async def load_failed(self, error: AppLoadError, names: list[str]) -> None:
        """Say that a file of the apps directory no longer loads; ``names``, the apps last
        loaded from it, keep their last good version (and are announced again once it loads)."""
        source = error.path.name
        data = AppLoadFailedData(
            source=source, line=error.line, message=error.reason[:MAX_LOAD_ERROR],
            apps=tuple(sorted(names)),
        )  # fmt: skip
        event = AppLoadFailed.create(
            site=self._site, aggregate_id=derived_id("app-source", self._site, source),
            actor=self.actor, data=data,
        )  # fmt: skip
        await self._log.append(event, expect=None)
        published = self._load_state()
        failed = set(published.get(_FAILED, "").split()) | set(names)
        self._save_state({**published, _FAILED: " ".join(sorted(failed))})

    async def _announce(self, app: type[ApplicationDefinition], *, first: bool) -> str:
        model = to_app_model(app, self._site)
        aggregate = self._aggregate(model.name)
        if first:
            registered = AppRegistered.create(
                site=self._site, aggregate_id=aggregate, actor=self.actor, data=model
            )
            if await commit_one(self._log, Append(registered, 0)):
                return "registered"
            # Lost: registered before this state file existed, so update instead.
        updated = AppUpdated.create(site=self._site, aggregate_id=aggregate, actor=self.actor,
                                    data=model)  # fmt: skip
        await self._log.append(updated, expect=None)
        return "updated"

    def _aggregate(self, name: str) -> uuid.UUID:
        return derived_id("app", self._site, name)

    def _load_state(self) -> dict[str, str]:
        if not self._state_file.exists():
            return {}
        data = json.loads(self._state_file.read_text())
        return {str(k): str(v) for k, v in data.items()}

    def _save_state(self, published: dict[str, str]) -> None:
        self._state_file.parent.mkdir(parents=True, exist_ok=True)
        self._state_file.write_text(json.dumps(published, indent=2, sort_keys=True) + "\n")
