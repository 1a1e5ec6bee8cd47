"""Site events: a user registers a site, binds its public key, and may remove it; the site
itself declares the transfer locations it trusts."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, StringConstraints

from lodestream.schemas.envelope import EXACT_VERSION, Event, EventData
from lodestream.schemas.nkey import UserPublicKey
from lodestream.schemas.resources import LocationName, LocationUrl
from lodestream.schemas.subjects import SiteSlug


class SiteRegisteredData(EventData):
    name: SiteSlug
    owner: Annotated[str, StringConstraints(min_length=1, max_length=120)]
    description: str = ""
    public_key: UserPublicKey | None = None


class SiteKeyData(EventData):
    public_key: UserPublicKey


class SiteRemovedData(EventData):
    reason: str = ""


class SiteLocationsData(EventData):
    """The remote locations this site's transfer module can reach, by name (``settings.yml``'s
    ``transfers.locations``). A job may stage only through one of them: the api refuses any
    other at submission. The URLs say which backend moves the data (globus, rsync, local)."""

    locations: dict[LocationName, LocationUrl] = Field(default_factory=dict, max_length=256)


class SiteRegistered(Event):
    event_type: ClassVar[str] = "site.registered"
    type: Literal["site.registered"] = "site.registered"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: SiteRegisteredData


class SiteKeyBound(Event):
    event_type: ClassVar[str] = "site.key_bound"
    type: Literal["site.key_bound"] = "site.key_bound"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: SiteKeyData


class SiteRemoved(Event):
    event_type: ClassVar[str] = "site.removed"
    type: Literal["site.removed"] = "site.removed"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: SiteRemovedData = SiteRemovedData()


class SiteLocationsSet(Event):
    """Appended by the site agent at start (and whenever its settings change the set); the
    newest one is the site's set. On the site's own aggregate, without compare-and-set: each
    is the whole set, so the last one folded wins."""

    event_type: ClassVar[str] = "site.locations_set"
    type: Literal["site.locations_set"] = "site.locations_set"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: SiteLocationsData


SITE_EVENTS: tuple[type[Event], ...] = (SiteRegistered, SiteKeyBound, SiteRemoved, SiteLocationsSet)
