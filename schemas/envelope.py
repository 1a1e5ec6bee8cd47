"""The event envelope every fact on the log shares.

Concrete events subclass :class:`Event`, pin ``type`` and ``v`` with
``Literal`` defaults and narrow ``data`` to their own payload model, so a
whole event validates in one pass through a discriminated union.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Final, Self

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    StringConstraints,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

from lodestream.schemas.ids import uuid7
from lodestream.schemas.subjects import SiteSlug, aggregate_filter, event_subject

ACTOR_PATTERN: Final = r"^(api|user|controller|site|launcher|system):[A-Za-z0-9._@:-]{1,120}$"
Actor = Annotated[str, StringConstraints(pattern=ACTOR_PATTERN)]
"""Who appended an event: ``user:<name>``, ``controller:<name>``, ``site:<site>``,
``launcher:<session>``."""


class _ExactVersion:
    """Pins an event class's ``v`` to the JSON integer itself.

    pydantic's ``Literal[1]`` also takes ``1.0`` and ``true`` for ``1``; the codec has always
    refused those as versions, and a class validated alone on the bytes (``decode_as``) must
    too. A strict integer check first, in Rust like the literal; JSON Schema shows the literal.
    """

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.chain_schema([core_schema.int_schema(strict=True), handler(source)])

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return handler(schema["steps"][-1])


EXACT_VERSION: Final = _ExactVersion()
"""Use as ``v: Annotated[Literal[1], EXACT_VERSION] = 1``."""


class EventData(BaseModel):
    """Base of every event payload: immutable, no unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: ClassVar[str] = ""

    id: uuid.UUID
    type: str
    v: int
    site: SiteSlug
    aggregate_id: uuid.UUID
    occurred_at: AwareDatetime
    actor: Actor
    causation_id: uuid.UUID | None = None
    correlation_id: uuid.UUID | None = None
    # Each event type narrows this to its payload: an EventData subclass, or a resource
    # model sent as-is (JobSpec, App), which is why the base is BaseModel and not EventData.
    data: BaseModel

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        event_type = getattr(cls, "event_type", None)
        if isinstance(event_type, str):
            cls.kind = event_type.partition(".")[0]

    @classmethod
    def create(
        cls,
        *,
        site: str,
        aggregate_id: uuid.UUID,
        actor: str,
        data: BaseModel | None = None,
        event_id: uuid.UUID | None = None,
        causation_id: uuid.UUID | None = None,
        correlation_id: uuid.UUID | None = None,
        occurred_at: datetime | None = None,
    ) -> Self:
        """Build a new event of this type, stamping id and producer time."""
        fields: dict[str, Any] = {
            "id": event_id or uuid7(),
            "site": site,
            "aggregate_id": aggregate_id,
            "occurred_at": occurred_at or datetime.now(UTC),
            "actor": actor,
            "causation_id": causation_id,
            "correlation_id": correlation_id,
        }
        if data is not None:  # otherwise the event type's default payload applies
            fields["data"] = data
        return cls.model_validate(fields)

    @property
    def subject(self) -> str:
        return event_subject(self.site, self.type, self.aggregate_id)

    @property
    def aggregate_subjects(self) -> str:
        return aggregate_filter(self.site, self.type.partition(".")[0], self.aggregate_id)


def now() -> datetime:
    return datetime.now(UTC)
