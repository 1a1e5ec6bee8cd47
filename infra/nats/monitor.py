"""What a user's monitoring credential may do on the bus: read its own sites' events, live.

``lode watch`` and :func:`lodestream.client.watch.watch` read the ``EVENTS`` stream
directly (wss://, an nkey of the user's) instead of polling the API. The key may
read every event of the user's sites and nothing else: no publish to any event or
heartbeat subject, no other site, no stream administration, no other consumer.

How nats-server's subject permissions pin that down (wildcards match whole tokens only):

* A reader needs a consumer. The key may create one only through the *filtered* form
  ``$JS.API.CONSUMER.CREATE.EVENTS.<name>.<filter>``: the server refuses a request
  whose body's ``name`` or ``filter_subject`` differs from the subject's tokens, so the
  grant ``….<name>.evt.<site>.>`` fixes both the filter (one of the user's sites) and
  the name.
* The name is one of :data:`SLOTS` names derived from the key itself
  (:func:`consumer_names`). A grant with ``*`` for the name would let the key
  *update* another consumer (a site's ``launch-<site>`` durable, say) to a filter of
  its own, or pull from it; enumerated names make every other consumer unreachable.
  Several slots let a user run several watchers at once.
* Messages come back on the key's own inbox prefix (:func:`monitor_inbox_prefix`), the
  only subject it may subscribe to. Pulls (``MSG.NEXT``), ``INFO`` and ``DELETE`` are
  granted for its own consumer names only.

What a body can still say: nats-server does not judge a create request's options
against the client's permissions. A push ``deliver_subject`` on the log's own subjects
is refused as a cycle; elsewhere it is accepted, and one aimed at another site's
heartbeat subject was seen to deliver nothing there (tests/security/test_monitor_key.py).
Either way the consumer carries only the user's own sites' events; its start options
only change how those reach the user.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from lodestream.schemas.nkey import check_user_public_key
from lodestream.schemas.subjects import EVENTS_STREAM, check_site

SLOTS: Final = 8
"""Watchers one user may run at once (each holds one consumer per site)."""

Permissions = dict[str, dict[str, list[str]]]


@dataclass(frozen=True, slots=True)
class MonitorKey:
    """One user's monitoring public key and the sites it may read (the user's live sites)."""

    user: str
    public_key: str
    sites: tuple[str, ...]


def monitor_tag(public_key: str) -> str:
    """A short, stable token naming one key's consumers and inbox (no dots, no wildcards)."""
    check_user_public_key(public_key)
    return hashlib.sha256(public_key.encode()).hexdigest()[:16]


def monitor_inbox_prefix(public_key: str) -> str:
    """The inbox prefix a watcher must connect with (``inbox_prefix=``)."""
    return f"_INBOX_mon_{monitor_tag(public_key)}"


def consumer_names(public_key: str) -> tuple[str, ...]:
    """The only consumer names this key may create, pull from, inspect or delete."""
    tag = monitor_tag(public_key)
    return tuple(f"watch-{tag}-{slot}" for slot in range(SLOTS))


def site_filter(site: str) -> str:
    """The one filter a watcher's consumer for ``site`` may have: every event of the site."""
    return f"evt.{check_site(site)}.>"


def create_subject(name: str, site: str) -> str:
    """The filtered create subject; the server holds the body to its name and filter."""
    return f"$JS.API.CONSUMER.CREATE.{EVENTS_STREAM}.{name}.{site_filter(site)}"


def monitor_permissions(public_key: str, sites: Iterable[str]) -> Permissions:
    """The monitoring key's permissions; anything not allowed here is denied."""
    names = consumer_names(public_key)
    publish = [create_subject(name, site) for site in sorted(set(sites)) for name in names]
    for name in names:
        publish += [
            f"$JS.API.CONSUMER.MSG.NEXT.{EVENTS_STREAM}.{name}",
            f"$JS.API.CONSUMER.INFO.{EVENTS_STREAM}.{name}",
            f"$JS.API.CONSUMER.DELETE.{EVENTS_STREAM}.{name}",
        ]
    return {
        "publish": {"allow": publish},
        "subscribe": {"allow": [f"{monitor_inbox_prefix(public_key)}.>"]},
    }
