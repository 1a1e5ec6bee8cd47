"""ApplicationDefinition events, published by a site agent for the apps it hosts."""

from __future__ import annotations

from typing import ClassVar, Literal

from lodestream.schemas.envelope import Event, EventData
from lodestream.schemas.resources import App, AppName


class AppRemovedData(EventData):
    name: AppName


class AppRegistered(Event):
    event_type: ClassVar[str] = "app.registered"
    type: Literal["app.registered"] = "app.registered"
    v: Literal[1] = 1
    data: App


class AppUpdated(Event):
    event_type: ClassVar[str] = "app.updated"
    type: Literal["app.updated"] = "app.updated"
    v: Literal[1] = 1
    data: App


class AppRemoved(Event):
    event_type: ClassVar[str] = "app.removed"
    type: Literal["app.removed"] = "app.removed"
    v: Literal[1] = 1
    data: AppRemovedData


APP_EVENTS: tuple[type[Event], ...] = (AppRegistered, AppUpdated, AppRemoved)
