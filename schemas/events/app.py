"""ApplicationDefinition events, published by a site agent for the apps it hosts."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from lodestream.schemas.envelope import EXACT_VERSION, Event, EventData
from lodestream.schemas.resources import App, AppName


class AppRemovedData(EventData):
    name: AppName


class AppRegistered(Event):
    event_type: ClassVar[str] = "app.registered"
    type: Literal["app.registered"] = "app.registered"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: App


class AppUpdated(Event):
    event_type: ClassVar[str] = "app.updated"
    type: Literal["app.updated"] = "app.updated"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: App


class AppRemoved(Event):
    event_type: ClassVar[str] = "app.removed"
    type: Literal["app.removed"] = "app.removed"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: AppRemovedData


APP_EVENTS: tuple[type[Event], ...] = (AppRegistered, AppUpdated, AppRemoved)
