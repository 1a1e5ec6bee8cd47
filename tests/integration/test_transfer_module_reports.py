"""The site's transfer module on a real nats-server with a backend the test drives item by
item: an item is reported as soon as its backend says it settled, not when its whole task
ends, and a batch a service refuses as a whole is submitted again item by item, so that only
the item refused fails (issue 31, items 7 and 9)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

from nats.js import JetStreamContext

from lodestream.agents.site.settings import SiteSettings
from lodestream.agents.site.transfers.module import TransferModule
from lodestream.platform_adapters.transfers.base import (
    ItemOutcome,
    TaskStatus,
    TransferBackend,
    TransferBatch,
    TransferItem,
    TransferRefused,
)
from lodestream.schemas.envelope import Event
from lodestream.schemas.ids import uuid7
from lodestream.schemas.trust import event_from_message
from tests.integration.test_transfer_promptness import running_module as running_transfers
from tests.support.staging import Item, request

SITE: Final = "alpha"
WAIT_S: Final = 30.0


class DrivenBackend(TransferBackend):
    """Moves nothing: an item settles when the test says so; a task ends when all its items
    have. ``poison`` is a source the service refuses in any batch of several items."""

    name = "driven"

    def __init__(self, poison: str = "") -> None:
        self.poison = poison
        self.tasks: dict[str, TransferBatch] = {}
        self.outcomes: dict[str, ItemOutcome] = {}

    def check_item(self, batch: TransferBatch, item: TransferItem) -> None:
        pass  # the service, not the check, refuses the poison below

    def submit(self, batch: TransferBatch) -> str:
        if any(item.source == self.poison for item in batch.items):
            raise TransferRefused(f"the service refuses {self.poison!r}")
        self.tasks[batch.submission_key] = batch
        return batch.submission_key

    def poll(self, task_id: str) -> TaskStatus:
        batch = self.tasks[task_id]
        items = {
            i.item_id: self.outcomes[i.item_id] for i in batch.items if i.item_id in self.outcomes
        }
        return TaskStatus(task_id, final=len(items) == len(batch.items), items=items)

    def settle(self, item: Item) -> None:
        self.outcomes[str(item.id)] = ItemOutcome(ok=True, bytes_transferred=1)

    def settle_all(self) -> None:
        for batch in self.tasks.values():
            for item in batch.items:
                self.outcomes.setdefault(item.item_id, ItemOutcome(ok=True, bytes_transferred=1))


@asynccontextmanager
async def running_module(
    js: JetStreamContext, tmp_path: Path, backend: DrivenBackend
) -> AsyncIterator[TransferModule]:
    settings = SiteSettings.model_validate({
        "site": SITE, "nats": {"url": "wss://127.0.0.1:1"}, "directory": tmp_path,
        "transfers": {"locations": {"dtn": "local:/"}, "poll_interval_s": 0.05},
    })  # fmt: skip
    async with running_transfers(js, settings, build=lambda *_: backend) as module:
        yield module


async def requested(js: JetStreamContext, sources: list[str]) -> list[Item]:
    step, job = uuid7(), uuid.uuid4()
    return [
        await request(js, SITE, job, f"s{n}", "in", {"location": "dtn", "path": source}, step)
        for n, source in enumerate(sources)
    ]


async def ends(js: JetStreamContext) -> dict[uuid.UUID, Event]:
    """Each transfer item's end on the log (``xfer.succeeded`` or ``xfer.failed``)."""
    sub = await js.subscribe(f"evt.{SITE}.xfer.>", ordered_consumer=True)
    found: dict[uuid.UUID, Event] = {}
    try:
        while True:
            msg = await sub.next_msg(timeout=5)
            event = event_from_message(msg.subject, msg.data)
            if event.type in {"xfer.succeeded", "xfer.failed"}:
                found[event.aggregate_id] = event
            if msg.metadata.num_pending == 0:
                return found
    finally:
        await sub.unsubscribe()


async def until(what: str, probe: Callable[[], Awaitable[bool]]) -> None:
    async with asyncio.timeout(WAIT_S):
        while not await probe():
            await asyncio.sleep(0.02)


async def test_an_item_is_reported_when_it_settles_not_when_its_task_ends(
    js: JetStreamContext, tmp_path: Path
) -> None:
    backend = DrivenBackend()
    items = await requested(js, ["/a", "/b", "/c"])
    async with running_module(js, tmp_path, backend) as module:

        async def one_task() -> bool:
            return sum(len(batch.items) for batch in backend.tasks.values()) == 3

        await until("the items submitted", one_task)
        assert len(backend.tasks) == 1
        backend.settle(items[1])

        async def first_reported() -> bool:
            return items[1].id in await ends(js)

        await until("the settled item reported", first_reported)
        assert set(await ends(js)) == {items[1].id}  # the others are still moving
        assert len(module.inflight) == 1  # and their task still holds its slot
        backend.settle_all()

        async def all_reported() -> bool:
            return len(await ends(js)) == 3

        await until("every item reported", all_reported)
        await until("the task gone", lambda: asyncio.sleep(0, not module.inflight))
    reported = await ends(js)
    assert {event.type for event in reported.values()} == {"xfer.succeeded"}
    assert module.stats.succeeded == 3


async def test_a_batch_the_service_refuses_is_split_and_only_its_culprit_fails(
    js: JetStreamContext, tmp_path: Path
) -> None:
    backend = DrivenBackend(poison="/poison")
    items = await requested(js, ["/a", "/poison", "/c"])
    async with running_module(js, tmp_path, backend):

        async def alone() -> bool:
            backend.settle_all()
            return len(await ends(js)) == 3

        await until("every item ended", alone)
    reported = await ends(js)
    assert reported[items[1].id].type == "xfer.failed"
    assert reported[items[1].id].data.reason == "the service refuses '/poison'"  # type: ignore[attr-defined]
    assert {reported[i.id].type for i in (items[0], items[2])} == {"xfer.succeeded"}
    assert sorted(len(batch.items) for batch in backend.tasks.values()) == [1, 1]
