"""Keeps the embedded nats-server's authorization in line with the registered sites.

A site's public key reaches NATS like this: ``lode site init`` generates the
nkey at the site and registers the public key with the API, which appends
``site.registered``; the projector folds it into ``rm.sites``; this sync sees
the change and reloads nats-server with the re-rendered authorization
(SIGHUP, no restart). ``lode site rm`` removes the key the same way, and the
reload disconnects the site at once. A production NATS does the same with
operator/JWT mode or an auth callout (docs/operations.md).

Users' monitoring keys (``public.monitoring_keys``, registered through the API) follow the
same path: each is rendered with read access to its user's live sites
(:mod:`lodestream.infra.nats.monitor`), so registering or removing a site, or registering,
deleting or revoking a key, reloads the server.

One bad row must not lock everyone out: a site whose key does not decode as
an nkey user public key (or whose entry does not render) is left out of the
config and reported in :attr:`CredentialSync.invalid`, and the others are
applied. A reload nats-server refuses leaves it on its last good config
(:meth:`lodestream.infra.nats.server.NatsServer.reload`) and is counted in
:attr:`CredentialSync.refused`; nothing here raises into the supervisor.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any, Final

import psycopg
from sqlalchemy import func, select

from lodestream.infra.nats.auth import render_authorization
from lodestream.infra.nats.errors import ReloadError
from lodestream.infra.nats.monitor import MonitorKey
from lodestream.infra.nats.server import NatsServer
from lodestream.infra.postgres.compiled import Compiled
from lodestream.infra.postgres.tables import monitoring_keys, sites
from lodestream.schemas.nkey import check_user_public_key

log = logging.getLogger(__name__)
_SITE_KEYS: Final = Compiled.of(
    select(sites.c.name, sites.c.public_key).where(
        sites.c.removed_at.is_(None), sites.c.public_key.is_not(None)
    )
)

_MONITOR_KEYS: Final = Compiled.of(
    select(
        monitoring_keys.c.user_name,
        monitoring_keys.c.public_key,
        # Only the user's live sites; a user with none still connects, and reads nothing.
        func.array_remove(func.array_agg(sites.c.name), None),
    )
    .select_from(
        monitoring_keys.outerjoin(
            sites, (sites.c.owner == monitoring_keys.c.user_name) & sites.c.removed_at.is_(None)
        )
    )
    .group_by(monitoring_keys.c.user_name, monitoring_keys.c.public_key)
)

Applied = tuple[dict[str, str], tuple[MonitorKey, ...]]


@dataclasses.dataclass(slots=True)
class SyncCounters:
    reloads: int = 0
    refused: int = 0  # reloads nats-server refused; it kept its last good config
    last_error: str | None = None
    # site -> why its key is left out of the config
    invalid: dict[str, str] = dataclasses.field(default_factory=dict)


class CredentialSync:
    def __init__(self, nats: NatsServer, database_url: str, user: str, password: str) -> None:
        self._nats = nats
        self._dsn = database_url
        self._user = user
        self._password = password
        self._applied: Applied | None = None
        self.counters = SyncCounters()

    @property
    def refused(self) -> int:
        return self.counters.refused

    @property
    def invalid(self) -> dict[str, str]:
        return dict(self.counters.invalid)

    def site_keys(self) -> dict[str, str]:
        return self.keys()[0]

    def keys(self) -> Applied:
        """The live sites' keys, and each monitoring key with its user's live sites."""
        with psycopg.connect(self._dsn, connect_timeout=2) as conn:
            rows = conn.execute(_SITE_KEYS.sql, _SITE_KEYS.params()).fetchall()
            monitors = conn.execute(_MONITOR_KEYS.sql, _MONITOR_KEYS.params()).fetchall()
        return (
            {str(name): str(key) for name, key in rows},
            tuple(
                MonitorKey(str(user), str(key), tuple(sorted(names or ())))
                for user, key, names in sorted(monitors)
            ),
        )

    def invalidate(self) -> None:
        """Compare with the server again on the next sync (after nats-server restarted)."""
        self._applied = None

    def sync_once(self) -> bool:
        """Reload nats-server if the set of site keys changed; True if it reloaded.

        Never raises for a bad key, a refused reload or an unreachable Postgres:
        each is logged and counted, and the next change (or restart) tries again.
        """
        if not self._nats.running:
            return False  # the supervisor restarts it, then invalidates: compared afresh then
        try:
            keys, monitors = applied = self.keys()
        except psycopg.Error as exc:
            log.warning("credential sync: cannot read sites: %s", exc)
            return False
        if applied == self._applied:
            return False
        authorization = render_authorization(
            self._user, self._password, self._usable(keys), self._usable_monitors(monitors)
        )
        config = dataclasses.replace(self._nats.config, authorization=authorization)
        if config == self._nats.config:
            self._applied = applied  # e.g. after a restart: the server already runs on these
            return False
        try:
            self._nats.reload(config)
        except ReloadError as exc:
            self._refused(applied, exc)
            return False
        self._applied = applied
        self.counters.reloads += 1
        log.info("nats authorization reloaded: %d site key(s)", len(keys) - len(self.invalid))
        return True

    def status(self) -> dict[str, Any]:
        return dataclasses.asdict(self.counters)

    def _usable(self, keys: Mapping[str, str]) -> dict[str, str]:
        """``keys`` without the sites whose entry would make nats-server refuse the config."""
        usable, invalid = {}, {}
        for site, key in keys.items():
            try:
                check_user_public_key(key)  # what nats-server checks: checksum included
                # Each entry on its own, so that any other refusal is pinned on one site.
                render_authorization(self._user, self._password, {site: key})
            except ValueError as exc:
                invalid[site] = f"{key!r}: {exc}"
                continue
            usable[site] = key
        for site in sorted(invalid.keys() - self.counters.invalid.keys()):
            log.error("site %s left out of nats authorization: key %s", site, invalid[site])
        self.counters.invalid = invalid
        return usable

    def _usable_monitors(self, monitors: tuple[MonitorKey, ...]) -> list[MonitorKey]:
        """``monitors`` without a key nats-server would refuse (the API checks them too)."""
        usable, invalid = [], []
        for monitor in monitors:
            try:
                render_authorization(self._user, self._password, {}, [monitor])
            except ValueError as exc:
                invalid.append(f"{monitor.user}: {exc}")
                continue
            usable.append(monitor)
        for why in invalid:
            log.error("monitoring key left out of nats authorization: %s", why)
        return usable

    def _refused(self, keys: Applied, exc: ReloadError) -> None:
        self.counters.last_error = str(exc)
        if not self._nats.running:
            # Not a verdict on the config: retried once the supervisor has restarted the server.
            log.warning("credential sync: nats-server is down; will retry: %s", exc)
            return
        self.counters.refused += 1
        # Retrying the same keys would be refused again; the next change is tried.
        self._applied = keys
        log.error("nats-server refused the new authorization, kept its last good config: %s", exc)
