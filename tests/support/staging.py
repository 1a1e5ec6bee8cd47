"""Data staging in tests: append what a site's agent, the controller and a site's transfer
module append (site locations, transfer items and their outcomes), as the real writers would
sign them, so that the projector folds them into the read models the API serves."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Final

from nats.js import JetStreamContext

from lodestream.eventlog import EventLog
from lodestream.schemas.envelope import Event
from lodestream.schemas.events import (
    SiteLocationsSet,
    TransferFailed,
    TransferRequested,
    TransferSubmitted,
    TransferSucceeded,
)
from lodestream.schemas.events.site import SiteLocationsData
from lodestream.schemas.events.xfer import (
    TransferDoneData,
    TransferFailedData,
    TransferRequestedData,
    TransferSubmittedData,
)
from lodestream.schemas.ids import derived_id
from lodestream.schemas.resources import TransferSpec
from lodestream.schemas.xfer import Direction, item_id

CONTROLLER: Final = "controller:main"
Outcome = TransferSubmittedData | TransferDoneData | TransferFailedData
_OUTCOMES: Final[dict[type[Outcome], type[Event]]] = {
    TransferSubmittedData: TransferSubmitted,
    TransferDoneData: TransferSucceeded,
    TransferFailedData: TransferFailed,
}


@dataclass(frozen=True)
class Item:
    id: uuid.UUID
    site: str
    seq: int  # of the event that requested it


async def declare_locations(js: JetStreamContext, site: str, locations: dict[str, str]) -> int:
    """Append ``site.locations_set`` as the site's agent does at start; its sequence."""
    event = SiteLocationsSet.create(
        site=site, aggregate_id=derived_id("site", site), actor=f"site:{site}",
        data=SiteLocationsData(locations=locations),
    )  # fmt: skip
    return (await EventLog(js).append(event, expect=None)).seq


async def request(
    js: JetStreamContext,
    site: str,
    job_id: uuid.UUID | str,
    slot: str,
    direction: Direction,
    remote: dict[str, Any],
    step: uuid.UUID,
) -> Item:
    """Append ``xfer.requested`` as the controller does for ``slot`` of step ``step``."""
    job = uuid.UUID(str(job_id))
    item = item_id(step, job, slot, direction)
    event = TransferRequested.create(
        site=site, aggregate_id=item, actor=CONTROLLER,
        data=TransferRequestedData(
            job_id=job, slot=slot, direction=direction,
            remote=TransferSpec.model_validate(remote), local_path=f"runs/{slot}", step_id=step,
        ),
    )  # fmt: skip
    appended = await EventLog(js).append(event, expect=0)
    return Item(item, site, appended.seq)


async def report(js: JetStreamContext, item: Item, data: Outcome) -> int:
    """Append the site's ``xfer.submitted``, ``succeeded`` or ``failed`` (by ``data``'s type)."""
    event = _OUTCOMES[type(data)].create(
        site=item.site, aggregate_id=item.id, actor=f"site:{item.site}", data=data
    )
    return (await EventLog(js).append(event, expect=None)).seq
