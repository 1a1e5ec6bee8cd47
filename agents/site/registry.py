"""Publishes the site's ApplicationDefinitions as app.registered / updated / removed events.

The API can only reference an app by name; this is how it learns the names,
their parameters and which hooks they define. What was last published is
kept in ``<site>/log/published-apps.json`` so an unchanged app is not
re-announced at every start.
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path

from lodestream.agents.site.apps import ApplicationDefinition
from lodestream.agents.site.apps.loader import app_fingerprint, to_app_model
from lodestream.eventlog import ConflictError, EventLog
from lodestream.schemas.events import AppRegistered, AppRemoved, AppUpdated
from lodestream.schemas.events.app import AppRemovedData
from lodestream.schemas.ids import derived_id

log = logging.getLogger(__name__)


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
        changes: dict[str, str] = {}
        for name, app in sorted(apps.items()):
            fingerprint = app_fingerprint(app)
            if published.get(name) == fingerprint:
                continue
            changes[name] = await self._announce(app, first=name not in published)
            published[name] = fingerprint
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

    async def _announce(self, app: type[ApplicationDefinition], *, first: bool) -> str:
        model = to_app_model(app, self._site)
        aggregate = self._aggregate(model.name)
        if first:
            registered = AppRegistered.create(
                site=self._site, aggregate_id=aggregate, actor=self.actor, data=model
            )
            try:
                await self._log.append(registered, expect=0)
            except ConflictError:
                pass  # registered before this state file existed: update instead
            else:
                return "registered"
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
