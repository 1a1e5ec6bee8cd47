"""ApplicationDefinition events, published by a site agent for the apps it hosts.

An app's ``version`` changes with its file; ``app.load_failed`` says that an edited file
no longer loads: its apps keep their last good version (the site goes on running it), and
the error shows beside them until the file loads again (the next ``app.updated`` clears it).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Final, Literal

from pydantic import Field, StringConstraints

from lodestream.schemas.envelope import EXACT_VERSION, Event, EventData
from lodestream.schemas.resources import INT32_MAX, NUL_FREE_PATTERN, App, AppName

MAX_LOAD_ERROR: Final = 2000


class AppRemovedData(EventData):
    name: AppName


class AppLoadFailedData(EventData):
    """Why ``source`` (a file of the site's ``apps/``) no longer loads, and the apps last
    loaded from it, which keep their last good version."""

    source: Annotated[
        str, StringConstraints(min_length=1, max_length=255, pattern=NUL_FREE_PATTERN)
    ]
    line: int | None = Field(None, ge=1, le=INT32_MAX)
    message: Annotated[str, StringConstraints(max_length=MAX_LOAD_ERROR, pattern=NUL_FREE_PATTERN)]
    apps: tuple[AppName, ...] = Field(default=(), max_length=1000)


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


class AppLoadFailed(Event):
    event_type: ClassVar[str] = "app.load_failed"
    type: Literal["app.load_failed"] = "app.load_failed"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: AppLoadFailedData


APP_EVENTS: tuple[type[Event], ...] = (AppRegistered, AppUpdated, AppRemoved, AppLoadFailed)
