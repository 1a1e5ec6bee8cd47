"""Site events: a user registers a site, binds its public key, and may remove it."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import StringConstraints

from lodestream.schemas.envelope import Event, EventData
from lodestream.schemas.nkey import UserPublicKey
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


class SiteRegistered(Event):
    event_type: ClassVar[str] = "site.registered"
    type: Literal["site.registered"] = "site.registered"
    v: Literal[1] = 1
    data: SiteRegisteredData


class SiteKeyBound(Event):
    event_type: ClassVar[str] = "site.key_bound"
    type: Literal["site.key_bound"] = "site.key_bound"
    v: Literal[1] = 1
    data: SiteKeyData


class SiteRemoved(Event):
    event_type: ClassVar[str] = "site.removed"
    type: Literal["site.removed"] = "site.removed"
    v: Literal[1] = 1
    data: SiteRemovedData = SiteRemovedData()


SITE_EVENTS: tuple[type[Event], ...] = (SiteRegistered, SiteKeyBound, SiteRemoved)
