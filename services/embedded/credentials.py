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

nats-server refuses a whole configuration for one bad entry, and a refused configuration
changes nothing for anyone. So no binding may hold the others back:

* before rendering, each binding is checked on its own and the keys are deduplicated
  (:mod:`lodestream.services.embedded.bindings`); what cannot go in is left out;
* if nats-server refuses the configuration anyway, the bindings that changed since the last
  accepted one are tried again in halves, down to the one(s) it refuses: those are left
  out (until they change), everything else is applied;
* what was left out and why, and the sync's state, go to ``public.credential_rejects`` and
  ``public.credential_sync`` (:mod:`lodestream.services.embedded.syncstate`), where the API
  shows them to each binding's owner and in ``/healthz``.

Nothing here raises into the supervisor: a refused reload, an unreachable Postgres or a
nats-server that is down is logged, counted and reported as the state ``stuck``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from typing import Any, Final

import psycopg
from sqlalchemy import func, select

from lodestream.infra.nats.auth import render_authorization
from lodestream.infra.nats.errors import ReloadError
from lodestream.infra.nats.monitor import MonitorKey
from lodestream.infra.nats.server import NatsServer
from lodestream.infra.postgres.compiled import Compiled
from lodestream.infra.postgres.tables import bound_keys, monitoring_keys, sites
from lodestream.services.embedded.bindings import Binding, Holder, Kind, plan
from lodestream.services.embedded.syncstate import State, SyncState, publish

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

_CLAIMS: Final = Compiled.of(
    select(bound_keys.c.public_key, bound_keys.c.kind, bound_keys.c.holder)
)

_REASON_CHARS: Final = 300


@dataclasses.dataclass(slots=True)
class SyncCounters:
    state: State = "ok"
    detail: str = ""
    reloads: int = 0
    refused: int = 0  # reloads nats-server refused; it kept its last good config
    last_error: str | None = None
    # site -> why its key is left out of the config
    invalid: dict[str, str] = dataclasses.field(default_factory=dict)
    # every binding left out: kind, holder, key and why (what `lode doctor` prints)
    rejected: list[dict[str, str]] = dataclasses.field(default_factory=list)


class _NatsDown(Exception):
    """nats-server exited during a reload: no verdict on the config."""


class CredentialSync:
    def __init__(
        self,
        nats: NatsServer,
        database_url: str,
        user: str,
        password: str,
        *,
        reserved: Collection[str] = (),
    ) -> None:
        """``reserved``: the control plane's own public keys, never rendered for anyone."""
        self._nats = nats
        self._dsn = database_url
        self._user = user
        self._password = password
        self._reserved = frozenset(reserved)
        self._applied: frozenset[Binding] | None = None
        self._attempted: frozenset[Binding] | None = None  # refused as a whole; not retried
        self._refused: dict[Binding, str] = {}  # bindings nats-server refused, until they change
        self._since: dict[Binding, datetime] = {}
        self._rejects: dict[Binding, str] = {}  # left out of the config now, and why
        self._published: SyncState | None = None
        self.counters = SyncCounters()

    @property
    def refused(self) -> int:
        return self.counters.refused

    @property
    def invalid(self) -> dict[str, str]:
        return dict(self.counters.invalid)

    def bindings(self) -> tuple[list[Binding], dict[str, Holder]]:
        """The live sites' and the monitoring keys' bindings, and who each key is bound to."""
        with psycopg.connect(self._dsn, connect_timeout=2) as conn:
            rows = conn.execute(_SITE_KEYS.sql, _SITE_KEYS.params()).fetchall()
            monitors = conn.execute(_MONITOR_KEYS.sql, _MONITOR_KEYS.params()).fetchall()
            claims = conn.execute(_CLAIMS.sql, _CLAIMS.params()).fetchall()
        found = [Binding("site", str(name), str(key)) for name, key in rows]
        found += [
            Binding("monitor", str(user), str(key), tuple(sorted(names or ())))
            for user, key, names in monitors
        ]
        return found, {str(key): (_kind(kind), str(holder)) for key, kind, holder in claims}

    def invalidate(self) -> None:
        """Compare with the server again on the next sync (after nats-server restarted)."""
        self._applied = None
        self._attempted = None

    def sync_once(self) -> bool:
        """Reload nats-server if the usable bindings changed; True if it reloaded.

        Never raises for a bad key, a refused reload or an unreachable Postgres:
        each is logged, counted and published, and the next change (or restart) tries again.
        """
        if not self._nats.running:
            self._report("stuck", "nats-server is not running; the supervisor restarts it")
            return False  # the supervisor restarts it, then invalidates: compared afresh then
        try:
            found, claims = self.bindings()
        except psycopg.Error as exc:
            log.warning("credential sync: cannot read the bindings: %s", exc)
            self._report("stuck", f"cannot read the bindings from Postgres: {exc}"[:_REASON_CHARS])
            return False
        planned = plan(found, claims, self._reserved, self._check)
        present = set(found)
        self._refused = {b: why for b, why in self._refused.items() if b in present}
        wanted = frozenset(planned.usable) - self._refused.keys()
        self._note_rejects({**planned.rejects, **self._refused})
        if wanted in (self._applied, self._attempted):
            self._report(*self._steady_state())
            return False
        try:
            reloaded = self._apply(wanted)
        except _NatsDown:
            self._report("stuck", "nats-server exited during a reload; retried once it is back")
            return False
        self._note_rejects({**planned.rejects, **self._refused})
        self._report(*self._steady_state())
        return reloaded

    def status(self) -> dict[str, Any]:
        return dataclasses.asdict(self.counters)

    def _apply(self, wanted: frozenset[Binding]) -> bool:
        """Reload with ``wanted``; if refused, with all of it but what nats-server refuses."""
        previous = self._applied or frozenset()
        if self._render(wanted) == self._nats.config.authorization:
            self._applied = wanted  # e.g. after a restart: the server already runs on these
            return False
        if self._reload(wanted) is None:
            return self._accepted(wanted)
        kept = sorted(wanted & previous)
        refused = self._reload(frozenset(kept))
        if refused is not None:
            # Not a binding's doing: the config is refused without any new one. Retried on the
            # next change; until then nats-server runs on its last good config.
            self._attempted = wanted
            log.error("nats-server refused the authorization without a new binding: %s", refused)
            return False
        applied = self._admit(kept, sorted(wanted - previous))
        return self._accepted(frozenset(applied))

    def _admit(self, base: list[Binding], candidates: Sequence[Binding]) -> list[Binding]:
        """``base`` (accepted) plus every candidate nats-server accepts with it: halves first."""
        if not candidates:
            return base
        refused = self._reload(frozenset([*base, *candidates]))
        if refused is None:
            return [*base, *candidates]
        if len(candidates) == 1:
            why = _reason(refused)
            self._refused[candidates[0]] = why
            log.error("nats-server refused %s; left out: %s", _name(candidates[0]), why)
            return base
        half = len(candidates) // 2
        return self._admit(self._admit(base, candidates[:half]), candidates[half:])

    def _reload(self, bindings: frozenset[Binding]) -> ReloadError | None:
        """Reload with ``bindings``; the refusal, if nats-server refused them."""
        config = dataclasses.replace(self._nats.config, authorization=self._render(bindings))
        try:
            self._nats.reload(config)
        except ReloadError as exc:
            if not self._nats.running:
                raise _NatsDown from exc
            self.counters.refused += 1
            self.counters.last_error = str(exc)
            return exc
        return None

    def _accepted(self, applied: frozenset[Binding]) -> bool:
        self._applied = applied
        self._attempted = None
        self.counters.reloads += 1
        sites = sum(b.kind == "site" for b in applied)
        log.info(
            "nats authorization reloaded: %d site key(s), %d other(s)", sites, len(applied) - sites
        )
        return True

    def _render(self, bindings: Collection[Binding]) -> str:
        keys = {b.holder: b.public_key for b in bindings if b.kind == "site"}
        monitors = [
            MonitorKey(b.holder, b.public_key, b.sites) for b in bindings if b.kind == "monitor"
        ]
        return render_authorization(self._user, self._password, keys, monitors)

    def _check(self, binding: Binding) -> None:
        self._render([binding])  # each entry on its own, so any refusal is pinned on one

    def _note_rejects(self, rejects: dict[Binding, str]) -> None:
        new = rejects.keys() - self._since.keys()
        for binding in sorted(new):
            log.error("%s left out of nats authorization: %s", _name(binding), rejects[binding])
        now = datetime.now(UTC)
        self._since = {b: self._since.get(b, now) for b in rejects}
        self._rejects = dict(rejects)
        self.counters.invalid = {b.holder: why for b, why in rejects.items() if b.kind == "site"}
        self.counters.rejected = [
            {"kind": b.kind, "holder": b.holder, "public_key": b.public_key, "reason": why}
            for b, why in sorted(rejects.items())
        ]

    def _steady_state(self) -> tuple[State, str]:
        if self._attempted is not None:
            return "stuck", f"nats-server refuses the authorization: {self.counters.last_error}"[
                :_REASON_CHARS
            ]
        if self.counters.rejected:
            return "degraded", f"{len(self.counters.rejected)} binding(s) left out"
        return "ok", ""

    def _report(self, state: State, detail: str) -> None:
        self.counters.state, self.counters.detail = state, detail
        current = SyncState(
            state, detail, self.counters.reloads, self.counters.refused,
            {b: (why, self._since[b]) for b, why in self._rejects.items()},
        )  # fmt: skip
        if current == self._published:
            return
        try:
            publish(self._dsn, current)
        except psycopg.Error as exc:
            log.warning("credential sync: cannot publish its state: %s", exc)
            return
        self._published = current


def _kind(value: object) -> Kind:
    if value == "site":
        return "site"
    if value == "monitor":
        return "monitor"
    raise ValueError(f"unknown binding kind {value!r}")


def _name(binding: Binding) -> str:
    what = "site" if binding.kind == "site" else "monitoring key of user"
    return f"{what} {binding.holder!r} (key {binding.public_key})"


def _reason(exc: ReloadError) -> str:
    """The line of nats-server's refusal that says why (its last non-empty one)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (f"nats-server refused it: {lines[-1]}" if lines else "nats-server refused it")[
        :_REASON_CHARS
    ]
