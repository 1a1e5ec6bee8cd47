"""Keeps the embedded nats-server's authorization in line with the registered sites.

A site's public key reaches NATS like this: ``lode site init`` generates the
nkey at the site and registers the public key with the API, which appends
``site.registered``; the projector folds it into ``rm.sites``; this sync sees
the change and reloads nats-server with the re-rendered authorization
(SIGHUP, no restart). ``lode site rm`` removes the key the same way, and the
reload disconnects the site at once. A production NATS does the same with
operator/JWT mode or an auth callout (docs/operations.md).
"""

from __future__ import annotations

import dataclasses
import logging

import psycopg

from infra.nats.auth import render_authorization
from infra.nats.server import NatsServer

log = logging.getLogger(__name__)


class CredentialSync:
    def __init__(self, nats: NatsServer, database_url: str, user: str, password: str) -> None:
        self._nats = nats
        self._dsn = database_url
        self._user = user
        self._password = password
        self._applied: dict[str, str] | None = None

    def site_keys(self) -> dict[str, str]:
        with psycopg.connect(self._dsn, connect_timeout=2) as conn:
            rows = conn.execute(
                "SELECT name, public_key FROM rm.sites "
                "WHERE removed_at IS NULL AND public_key IS NOT NULL"
            ).fetchall()
        return {str(name): str(key) for name, key in rows}

    def sync_once(self) -> bool:
        """Reload nats-server if the set of site keys changed; True if it reloaded."""
        try:
            keys = self.site_keys()
        except psycopg.Error as exc:
            log.warning("credential sync: cannot read sites: %s", exc)
            return False
        if keys == self._applied:
            return False
        config = dataclasses.replace(
            self._nats.config,
            authorization=render_authorization(self._user, self._password, keys),
        )
        self._nats.reload(config)
        log.info("nats authorization reloaded: %d site key(s)", len(keys))
        self._applied = keys
        return True
