"""Launcher session events, and the heartbeat record carried on the HB stream."""

from __future__ import annotations

import uuid
from typing import Annotated, ClassVar, Final, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints

from lodestream.schemas.envelope import EXACT_VERSION, Event, EventData
from lodestream.schemas.resources import INT64_MAX, NodeInfo
from lodestream.schemas.subjects import SiteSlug

MAX_CACHED_SOURCES: Final = 512  # per heartbeat: about 10 KB at most, every quarter TTL
SourceId = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16}$")]


class SessionOpenedData(EventData):
    batch_job_id: uuid.UUID | None = None
    hostname: str
    mode: Literal["serial", "mpi"] = "serial"
    nodes: tuple[NodeInfo, ...] = Field(min_length=1)
    deadline: AwareDatetime
    heartbeat_ttl_s: int = Field(ge=1, le=3600)


class SessionClosedData(EventData):
    reason: str = ""


class SessionExpiredData(EventData):
    """The server deleted the session's last heartbeat: the pilot is gone or cut off."""

    reason: str = "heartbeat expired"
    # Bounded so that JSON parsers agree (orjson reads an integer beyond 64 bits as a float).
    leases_expired: int = Field(0, ge=0, le=INT64_MAX)
    runs_timed_out: int = Field(0, ge=0, le=INT64_MAX)


class SessionOpened(Event):
    event_type: ClassVar[str] = "session.opened"
    type: Literal["session.opened"] = "session.opened"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: SessionOpenedData


class SessionClosed(Event):
    event_type: ClassVar[str] = "session.closed"
    type: Literal["session.closed"] = "session.closed"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: SessionClosedData = SessionClosedData()


class SessionExpired(Event):
    event_type: ClassVar[str] = "session.expired"
    type: Literal["session.expired"] = "session.expired"
    v: Annotated[Literal[1], EXACT_VERSION] = 1
    data: SessionExpiredData = SessionExpiredData()


class Heartbeat(BaseModel):
    """The body of ``hb.<site>.<session>``; the server's per-message TTL does the expiring."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    session_id: uuid.UUID
    site: SiteSlug
    at: AwareDatetime
    running: int = Field(0, ge=0)
    leased: int = Field(0, ge=0)
    free_cores: int = Field(0, ge=0)
    # The sources this pilot's node caches hold, most recently used first (their
    # ``source_id``s): what its peers at the site defer a job's delivery for
    # (docs/platforms.md, "Node-local caches and data-aware dispatch").
    cached: tuple[SourceId, ...] = Field((), max_length=MAX_CACHED_SOURCES)


SESSION_EVENTS: tuple[type[Event], ...] = (SessionOpened, SessionClosed, SessionExpired)
