"""Subject grammar of the log: ``evt.<site>.<kind>.<id>.<name>`` and ``hb.<site>.<session>``.

Site names become subject tokens, so they are restricted to a slug that can
never contain a NATS wildcard (``*``, ``>``), separator (``.``) or space.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Annotated, Final

from pydantic import StringConstraints

from lodestream.schemas.errors import SubjectError

SITE_SLUG_PATTERN: Final = r"^[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?$"
SiteSlug = Annotated[str, StringConstraints(pattern=SITE_SLUG_PATTERN)]

KINDS: Final = frozenset({"job", "batch", "session", "xfer", "app", "site", "scaler"})

EVENTS_STREAM: Final = "EVENTS"
HB_STREAM: Final = "HB"
HB_IN_STREAM: Final = "HBIN"  # what launchers publish to; HB sources it
EVENTS_SUBJECTS: Final = "evt.>"
HB_SUBJECTS: Final = "hb.>"

_SLUG_RE = re.compile(SITE_SLUG_PATTERN)


def check_site(site: str) -> str:
    if not _SLUG_RE.fullmatch(site):
        raise SubjectError(
            f"invalid site name {site!r}: use 1-40 lowercase letters, digits and inner hyphens"
        )
    return site


def event_subject(site: str, event_type: str, aggregate_id: uuid.UUID | str) -> str:
    kind, _, name = event_type.partition(".")
    return f"evt.{site}.{kind}.{aggregate_id}.{name}"


def aggregate_filter(site: str, kind: str, aggregate_id: uuid.UUID | str) -> str:
    """The subject filter that compare-and-set is evaluated against for one aggregate."""
    return f"evt.{site}.{kind}.{aggregate_id}.*"


def type_filter(site: str, event_type: str) -> str:
    """The filter for every event of ``event_type`` at ``site`` (``*``: at every site)."""
    kind, _, name = event_type.partition(".")
    return f"evt.{site}.{kind}.*.{name}"


def heartbeat_subject(site: str, session_id: uuid.UUID | str) -> str:
    return f"hb.{site}.{session_id}"


@dataclass(frozen=True, slots=True)
class EventSubject:
    site: str
    kind: str
    aggregate_id: str
    name: str

    @property
    def event_type(self) -> str:
        return f"{self.kind}.{self.name}"


def parse_event_subject(subject: str) -> EventSubject:
    parts = subject.split(".")
    # An empty or wildcard token means a filter or a malformed subject, never one event.
    if len(parts) != 5 or parts[0] != "evt" or not all(parts) or {"*", ">"} & set(parts):
        raise SubjectError(f"not an event subject: {subject!r}")
    _, site, kind, aggregate_id, name = parts
    if kind not in KINDS:
        raise SubjectError(f"unknown aggregate kind {kind!r} in {subject!r}")
    check_site(site)
    return EventSubject(site=site, kind=kind, aggregate_id=aggregate_id, name=name)
