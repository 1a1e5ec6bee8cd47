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
from lodestream.schemas.ids import derived_id, uuid7
from lodestream.schemas.resources import App, AppTransferSlot, TransferSpec
from lodestream.schemas.xfer import Direction, item_id
from tests.fixtures.api import ApiHarness

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


# --- a job reset and staged again, as the API's tests and the CLI's read it ---------------

SITE = "theta"
# URLs each backend's own parser accepts (tests/unit/test_transfer_globus.py checks it).
LOCATIONS = {
    "archive": "globus://5f2c0c4e-7a1b-4d6e-9f3a-2b8c1d0e4f6a/",
    "dtn": "rsync://dtn.example.org/scratch",
}
INPUT = {"location": "archive", "path": "/data/in.h5"}
PARAMS = {"location": "dtn", "path": "/cfg/[run 1].json"}  # '[' is no markup to anyone
RESULTS = {"location": "archive", "path": "/results/run1", "recursive": True}


@dataclass(frozen=True)
class Staged:
    job: str
    first_input: Item
    first_params: Item
    input: Item
    params: Item
    results: Item


async def staged_job(api: ApiHarness, user: str = "alice", site: str = SITE) -> Staged:
    """A job of ``user`` at ``site`` whose stage-in failed once and is in flight again."""
    await api.register_site(user, site)
    await api.wait_projected(await declare_locations(api.js, site, LOCATIONS))
    slots = {
        "input": AppTransferSlot(direction="in", local_path="in.h5"),
        "params": AppTransferSlot(direction="in", local_path="params.json"),
        "results": AppTransferSlot(direction="out", local_path="out", recursive=True),
    }
    await api.register_app(App(site=site, name="sim", transfers=slots))
    spec = {"site": site, "app": "sim", "workdir": "runs/1",
            "transfers": {"input": INPUT, "params": PARAMS, "results": RESULTS}}  # fmt: skip
    response = await api.submit(user, [spec])
    assert response.status_code == 201, response.text
    job = response.json()["jobs"][0]["id"]

    first = uuid7()  # job.ready: the first stage-in step
    first_input = await request(api.js, site, job, "input", "in", INPUT, first)
    first_params = await request(api.js, site, job, "params", "in", PARAMS, first)
    await report(api.js, first_input, TransferSubmittedData(task_id="task-1", items_in_task=2))
    await report(api.js, first_params, TransferSubmittedData(task_id="task-1", items_in_task=2))
    await report(api.js, first_params, TransferDoneData(bytes_transferred=2048, duration_s=1.5))
    await report(api.js, first_input, TransferFailedData(reason="no such file", permanent=True))

    again = uuid7()  # job.reset: staged again, with new items
    params = await request(api.js, site, job, "params", "in", PARAMS, again)
    input_ = await request(api.js, site, job, "input", "in", INPUT, again)
    await report(api.js, input_, TransferSubmittedData(task_id="task-2"))
    await report(api.js, input_, TransferSubmittedData(task_id="task-3", attempt=2))
    results = await request(api.js, site, job, "results", "out", RESULTS, uuid7())
    await api.wait_projected(results.seq)
    return Staged(job, first_input, first_params, input_, params, results)
