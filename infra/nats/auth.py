"""Who may do what on the bus: the control plane, and one least-privilege user per site.

docs/architecture.md §12: a site holds an nkey whose seed never leaves it; the
server knows only the public key. A site may append to its own subjects,
fetch and ack from its own durable pull consumers (which only the control
plane creates), and receive replies on its own inbox prefix. It cannot read
the stream, create consumers, or touch another site's subjects.

Everything here is pure: functions return data or config text, and the
caller decides where secrets are stored and when the server reloads.

Notes on nats-server behaviour that shaped the layout:

* Subject wildcards match whole tokens only (``*-alpha`` is not a pattern),
  so a site's consumers are enumerated: one grant set per row of
  :data:`lodestream.schemas.topology.SITE_FEEDS`, which also says what each row
  needs (fetch, info and ack for a durable; subscribe for a live feed) and why.
* JetStream PubAcks arrive on the inbox, like every fetched message, so the
  inbox and the live feeds are all a site ever subscribes to.
* A refused publish or subscribe is answered with ``-ERR 'Permissions
  Violation for …'`` and the connection stays open; a user removed by a
  reload is disconnected.
* Subjects starting with ``$`` must be quoted in the config file, or the
  parser takes them for variable references; everything is rendered as
  quoted JSON strings for that reason.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Collection, Mapping, Sequence
from typing import Final

from lodestream.infra.nats.monitor import MonitorKey, monitor_permissions
from lodestream.schemas.nkey import check_user_public_key
from lodestream.schemas.subjects import EVENTS_STREAM, check_site, type_filter
from lodestream.schemas.topology import SITE_CONSUMERS, site_grants
from lodestream.schemas.trust import WRITERS, site_writable_types

CONTROL_USER: Final = "lodestream"

_USERNAME_RE: Final = re.compile(r"[A-Za-z0-9_.-]{1,64}")

Permissions = dict[str, dict[str, list[str]]]


def new_password() -> str:
    """A control-plane password; generate it once and keep it with the server's state."""
    return secrets.token_urlsafe(32)


def site_inbox_prefix(site: str) -> str:
    """The inbox prefix a site's clients must connect with (``inbox_prefix=``)."""
    return f"_INBOX_{check_site(site)}"


def site_consumers(site: str) -> tuple[str, ...]:
    """Names of the durable pull consumers the control plane creates for ``site``."""
    check_site(site)
    return tuple(feed.durable(site) for feed in SITE_CONSUMERS)


def site_event_subjects(site: str) -> list[str]:
    """The event subjects a site key may publish, one per type a site may append.

    Rendered from :data:`lodestream.schemas.trust.WRITERS` (the state machine's "appended by"
    column): ``job.created``, ``job.killed``, ``site.key_bound`` and every other
    control-plane event are absent, so nats-server refuses a forged one before it is
    stored, and an event of those types on the log came from the control plane.
    """
    check_site(site)
    return [type_filter(site, event_type) for event_type in site_writable_types()]


def site_permissions(site: str, *, leaf_domain: str | None = None) -> Permissions:
    """The per-site permission template; anything not allowed here is denied.

    ``leaf_domain``: the hub's JetStream domain, for a site that connects a leaf node
    (:mod:`lodestream.infra.nats.leaf`); its grants then change as :func:`leaf_grants` says.
    """
    feeds = site_grants(site)  # fetch and ack its own consumers; listen to its live feeds
    publish = [*site_event_subjects(site), f"hb.{site}.*", *feeds.publish]
    # Telling "my retried append had landed" from "I was fenced", and a pilot's check for a
    # kill it did not hear, need the newest event of one aggregate; by subject only, and
    # only the site's own (a get by sequence could read any site's events).
    publish.append(f"$JS.API.DIRECT.GET.{EVENTS_STREAM}.evt.{site}.>")
    publish.append("$JS.API.INFO")
    permissions: Permissions = {
        "publish": {"allow": publish},
        "subscribe": {"allow": [f"{site_inbox_prefix(site)}.>", *feeds.subscribe]},
    }
    return leaf_grants(site, permissions, leaf_domain) if leaf_domain else permissions


def leaf_grants(site: str, permissions: Permissions, domain: str) -> Permissions:
    """The grants of a site whose processes reach the hub through the site's leaf node.

    Two things differ for a leaf connection (nats-server 2.15, checked by
    ``tests/integration/test_leaf_site.py``):

    * the leaf addresses the hub's JetStream through its domain, so every API subject is
      granted again as ``$JS.<domain>.API.…``, and acks arrive as
      ``$JS.ACK.<domain>.<account hash>.<stream>.<durable>.…``;
    * the hub sends a leaf its interest in a subject only if the leaf may publish on it,
      matched as a subject: a site allowed ``evt.<site>.job.*.started`` alone never hears of
      ``EVENTS``' ``evt.>`` and its appends find no stream. So a leaf site is allowed
      ``evt.<site>.>`` and denied every type it may not append (the control plane's, from
      the same table). What that adds is a type nobody knows on its own subjects, which the
      shared rule refuses at every consumer, as it refuses a garbled payload today.
    """
    publish = list(permissions["publish"]["allow"])
    api = [s for s in publish if s.startswith("$JS.API.")]
    publish += [s.replace("$JS.API.", f"$JS.{domain}.API.", 1) for s in api]
    acks = [s for s in publish if s.startswith("$JS.ACK.")]
    publish += [s.replace("$JS.ACK.", "$JS.ACK.*.*.", 1) for s in acks]
    own_types = set(site_event_subjects(site))
    publish = [s for s in publish if s not in own_types] + [f"evt.{site}.>"]
    denied = [type_filter(site, t) for t in sorted(WRITERS) if "site" not in WRITERS[t]]
    return {
        "publish": {"allow": publish, "deny": denied},
        "subscribe": permissions["subscribe"],
    }


def render_authorization(
    control_user: str,
    control_password: str,
    sites: Mapping[str, str],
    monitors: Sequence[MonitorKey] = (),
    *,
    leaf_sites: Collection[str] = (),
    leaf_domain: str | None = None,
) -> str:
    """The ``authorization { users = [...] }`` block for the control plane, ``sites`` and
    the users' monitoring keys (:mod:`lodestream.infra.nats.monitor`).

    ``sites`` maps a site name to its nkey public key. Password and nkey users
    share one ``users`` list (nats-server accepts the mix). The output is
    sorted by site so that re-rendering unchanged input yields the same text.
    ``leaf_sites`` may also connect a leaf node (over the websocket listener) to a hub whose
    JetStream domain is ``leaf_domain``; their permissions are :func:`leaf_grants`.
    """
    if leaf_sites and not leaf_domain:
        raise ValueError("leaf sites need the hub's JetStream domain (leaf_domain)")
    if not _USERNAME_RE.fullmatch(control_user):
        raise ValueError(f"invalid control-plane user name {control_user!r}")
    if not control_password:
        raise ValueError("the control-plane password must not be empty")
    entries = [
        "    # control plane: services (api, projector, controller); full permissions\n"
        f"    {{user: {_q(control_user)}, password: {_q(control_password)}}}"
    ]
    for site in sorted(sites):
        public_key = sites[site]
        check_site(site)
        try:
            check_user_public_key(public_key)  # checksum too: nats-server refuses a bad one
        except ValueError as exc:
            raise ValueError(f"site {site!r}: {exc}") from exc
        leaf = site in leaf_sites
        permissions = json.dumps(
            site_permissions(site, leaf_domain=leaf_domain if leaf else None), indent=2
        ).replace("\n", "\n      ")
        # Sites come in over wss:// only (a leaf node too); the plain listener is for the
        # control plane.
        types = '["WEBSOCKET", "LEAFNODE_WS"]' if leaf else '["WEBSOCKET"]'
        entries.append(
            f"    # site {site}{' (through its leaf node)' if leaf else ''}\n"
            f"    {{\n      nkey: {_q(public_key)}\n"
            f"      allowed_connection_types: {types}\n"
            f"      permissions: {permissions}\n    }}"
        )
    for monitor in sorted(monitors, key=lambda m: m.user):
        entries.append(_monitor_entry(monitor))
    return "authorization {\n  users = [\n" + "\n".join(entries) + "\n  ]\n}\n"


def _monitor_entry(monitor: MonitorKey) -> str:
    try:
        check_user_public_key(monitor.public_key)
    except ValueError as exc:
        raise ValueError(f"monitoring key of user {monitor.user!r}: {exc}") from exc
    permissions = json.dumps(monitor_permissions(monitor.public_key, monitor.sites), indent=2)
    return (
        # The user name is not rendered: it may hold characters a comment would not survive.
        f"    # a user's monitoring key: reads its {len(set(monitor.sites))} site(s)\n"
        f"    {{\n      nkey: {_q(monitor.public_key)}\n"
        '      allowed_connection_types: ["WEBSOCKET"]\n'
        f"      permissions: {permissions.replace(chr(10), chr(10) + '      ')}\n    }}"
    )


def _q(value: str) -> str:
    return json.dumps(value)
