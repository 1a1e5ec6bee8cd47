"""The one rule every consumer applies to a message before acting on it (docs/architecture.md §12).

Anything a site or a launcher writes is hostile until checked. The projector,
the controller, the site agent and the pilot all call :func:`check_event`
(or :func:`event_from_message`) on what they receive, so none of them acts on
an event another would refuse:

* the subject is an event subject, and its site, kind, aggregate id and type
  are the payload's;
* every site the payload names (a job's spec, a work item, an app) is the
  subject's site: a site cannot reach another site's jobs through its own
  subjects;
* the event type is one its writer may append (:data:`WRITERS`, the state
  machine's "appended by" column as data), and the payload's ``actor`` is of
  that writer. The actor is never *trusted* from the payload: nats-server only
  lets a site key publish the types a site may append (the permissions are
  rendered from :data:`WRITERS` in :mod:`lodestream.infra.nats.auth`), so an event on the
  log of a control-plane type came from the control plane, and one that claims
  otherwise is refused here.

Legality of the transition needs the job's state; a consumer that knows it
checks it with :func:`lodestream.schemas.fold.apply`. Heartbeats and the server's expiry
markers are read with :func:`heartbeat_message`, which tells a real marker
(written by nats-server in the ``HB`` stream) from a forged one (sourced from
what a site published).
"""

from __future__ import annotations

import functools
import typing
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson
from pydantic import BaseModel, ValidationError

from lodestream.schemas.codec import EVENT_CLASSES, decode_as
from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import DecodeError, Untrusted, first_line
from lodestream.schemas.events.job import CreatedData
from lodestream.schemas.events.session import Heartbeat
from lodestream.schemas.events.site import SiteRegistered
from lodestream.schemas.resources import App, JobSpec
from lodestream.schemas.states import BOTH, CONTROL, SITE, TRANSITIONS, Writer
from lodestream.schemas.subjects import HB_SUBJECTS, check_site

WRITERS: Final[dict[str, frozenset[Writer]]] = {
    **{name: t.writers for name, t in TRANSITIONS.items()},
    "session.opened": SITE,
    "session.closed": SITE,
    "session.expired": CONTROL,
    "app.registered": SITE,
    "app.updated": SITE,
    "app.removed": SITE,
    "app.load_failed": SITE,
    "batch.requested": BOTH,  # by a user through the api, or by the site's elastic queue
    "batch.submitted": SITE,
    "batch.queued": SITE,
    "batch.running": SITE,
    "batch.finished": SITE,
    "batch.submit_failed": SITE,
    "batch.deletion_requested": BOTH,
    "xfer.requested": CONTROL,
    "xfer.submitted": SITE,
    "xfer.succeeded": SITE,
    "xfer.failed": SITE,
    "site.registered": CONTROL,
    "site.key_bound": CONTROL,
    "site.removed": CONTROL,
    "site.locations_set": SITE,  # the site's own transfer locations (the api checks jobs by them)
    # The controller reads the read models for the site; the site's elastic queue decides.
    "scaler.backlog": CONTROL,
    "scaler.decided": SITE,
}
"""Who may append each event type. Every event class has an entry (a test checks it)."""

ACTOR_KINDS: Final[dict[Writer, frozenset[str]]] = {
    "control": frozenset({"api", "user", "controller", "system"}),
    "site": frozenset({"site", "launcher"}),
}
"""The actor prefixes each writer signs its events with."""

MARKER_HEADER: Final = "Nats-Marker-Reason"
SOURCE_HEADER: Final = "Nats-Stream-Source"


def site_writable_types() -> tuple[str, ...]:
    """The event types a site key may publish, sorted: what its permissions allow."""
    return tuple(sorted(name for name, writers in WRITERS.items() if "site" in writers))


def event_from_message(subject: str, data: bytes) -> Event:
    """Decode ``data`` received on ``subject`` and check it; raise :class:`Untrusted`."""
    # The subject names the type, so only that class is tried; a payload of another type
    # still decodes (as what it says it is) and is refused by check_event below.
    parts = subject.split(".")
    event_type = f"{parts[2]}.{parts[4]}" if len(parts) == 5 else ""
    try:
        event = decode_as(event_type, data)
    except DecodeError as exc:
        raise Untrusted(str(exc)) from exc
    return check_event(subject, event)


def check_event(subject: str, event: Event) -> Event:
    """Return ``event`` if the rule holds for it on ``subject``; raise :class:`Untrusted`."""
    # Token comparisons, not a parse: the payload's fields are already validated (the site
    # is a slug), so equality with them is all the subject has to show. This runs on every
    # hop of every event.
    parts = subject.split(".")
    if len(parts) != 5 or parts[0] != "evt":
        raise Untrusted(f"not an event subject: {subject!r}")
    _, site, kind, aggregate_id, name = parts
    if site != event.site:
        raise Untrusted(f"event for site {event.site!r} on a subject of site {site!r}")
    if event.type != f"{kind}.{name}":
        raise Untrusted(f"event type {event.type} on a subject for {kind}.{name}")
    if aggregate_id != str(event.aggregate_id):
        raise Untrusted(f"aggregate {event.aggregate_id} on a subject for {aggregate_id}")
    _check_actor(event)
    if _may_claim(type(event), type(event.data)):
        for claimed in _claimed_sites(event):
            if claimed != event.site:
                raise Untrusted(f"{event.type} at site {event.site!r} names site {claimed!r}")
    return event


def check_own_site(event: Event, site: str) -> Event:
    """For a site's own consumers: the event must be about ``site``."""
    if event.site != site:
        raise Untrusted(f"{event.type} for site {event.site!r} delivered to site {site!r}")
    return event


_ACTORS_OF: Final[dict[str, frozenset[str]]] = {
    name: frozenset().union(*(ACTOR_KINDS[w] for w in writers)) for name, writers in WRITERS.items()
}
"""The actor prefixes that may sign each event type: WRITERS and ACTOR_KINDS, joined once."""


def _check_actor(event: Event) -> None:
    actors = _ACTORS_OF.get(event.type)
    if actors is None:  # a type with no writer can only be a gap in the table
        raise Untrusted(f"no writer may append {event.type}")
    kind, _, name = event.actor.partition(":")
    if kind not in actors:
        allowed = " or ".join(sorted(WRITERS[event.type]))
        raise Untrusted(f"{event.type} is appended by the {allowed}, not by {event.actor}")
    if kind == "site" and name != event.site:
        raise Untrusted(f"{event.type} at site {event.site!r} signed by {event.actor}")


@functools.cache
def _may_claim(event_class: type[Event], data_class: type[BaseModel]) -> bool:
    """Whether an event of these classes can name a site at all: most payloads cannot,
    and this runs on every hop of every event."""
    return bool(
        _spec_paths(data_class)
        or issubclass(data_class, CreatedData | App)
        or issubclass(event_class, SiteRegistered)
    )


def _claimed_sites(event: Event) -> list[str]:
    """Every site the payload names, wherever a consumer could act on it."""
    data = event.data
    claimed = [spec.site for spec in _specs_in(data)]
    if isinstance(data, CreatedData) and data.site_choice is not None:
        claimed.append(data.site_choice.chosen)  # the other candidates are only figures
    if isinstance(data, App):
        claimed.append(data.site)
    elif isinstance(event, SiteRegistered):
        claimed.append(event.data.name)
    return claimed


def _specs_in(data: BaseModel) -> list[JobSpec]:
    specs = []
    for path in _spec_paths(type(data)):
        value: Any = data
        for name in path:
            value = getattr(value, name)
            if value is None:
                break
        if isinstance(value, JobSpec):
            specs.append(value)
    return specs


@functools.cache
def _spec_paths(model: type[BaseModel]) -> tuple[tuple[str, ...], ...]:
    """Where a payload class can hold a job spec (``()`` for a spec itself, ``("work",)``,
    ``("run", "work")``…), read once from its annotations so no new payload is missed."""
    if issubclass(model, JobSpec):
        return ((),)
    paths: list[tuple[str, ...]] = []
    for name, info in model.model_fields.items():
        for inner in _model_types(info.annotation):
            paths += [(name, *rest) for rest in _spec_paths(inner)]
    return tuple(paths)


def _model_types(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [t for arg in typing.get_args(annotation) for t in _model_types(arg)]


# --- heartbeats ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HeartbeatBeat:
    site: str
    session_id: uuid.UUID
    heartbeat: Heartbeat


@dataclass(frozen=True, slots=True)
class HeartbeatExpired:
    """nats-server removed the session's last heartbeat when its age ran out."""

    site: str
    session_id: uuid.UUID


def heartbeat_message(
    subject: str, headers: Mapping[str, str] | None, data: bytes
) -> HeartbeatBeat | HeartbeatExpired:
    """Read a message of the ``HB`` stream; raise :class:`Untrusted` for anything else.

    Sites publish heartbeats into ``HBIN``, which ``HB`` sources: everything a site wrote
    arrives with a ``Nats-Stream-Source`` header, and only a marker the server wrote in
    ``HB`` itself has none. A site that sets ``Nats-Marker-Reason`` on its own heartbeat
    therefore cannot make its session (or anyone's) look expired.
    """
    site, session_id = parse_heartbeat_subject(subject)
    headers = headers or {}
    if MARKER_HEADER in headers and SOURCE_HEADER not in headers:
        return HeartbeatExpired(site, session_id)
    try:
        heartbeat = Heartbeat.model_validate(orjson.loads(data))
    except (orjson.JSONDecodeError, ValidationError) as exc:
        raise Untrusted(f"invalid heartbeat: {first_line(exc)}") from exc
    if heartbeat.site != site or heartbeat.session_id != session_id:
        raise Untrusted("heartbeat body does not match its subject")
    return HeartbeatBeat(site, session_id, heartbeat)


def parse_heartbeat_subject(subject: str) -> tuple[str, uuid.UUID]:
    parts = subject.split(".")
    if len(parts) != 3 or parts[0] != HB_SUBJECTS.partition(".")[0]:
        raise Untrusted(f"not a heartbeat subject: {subject!r}")
    try:
        return check_site(parts[1]), uuid.UUID(parts[2])
    except ValueError as exc:  # SubjectError and a malformed UUID alike
        raise Untrusted(f"not a heartbeat subject: {subject!r}") from exc


def event_types() -> frozenset[str]:
    return frozenset(EVENT_CLASSES)
