"""How soon the site's transfer module moves a small file through a backend of this machine
(local, rsync without ssh), on a real nats-server with the real module and backends, at the
site's default ``poll_interval_s``; and that items delivered together still go in one task per
location and direction.

Read from the log, as an outsider would: ``occurred_at`` of each item's ``xfer.requested``
and ``xfer.succeeded``, and the task ids of its ``xfer.submitted``. Before the module submitted
these backends' batches once its feed was drained and polled their tasks at their own pace,
an item waited for the next poll cycle to be submitted and for one more to be noticed: never
less than one ``poll_interval_s`` from request to success.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final, TypeVar

import pytest
from nats.js import JetStreamContext

from lodestream.agents.site.settings import SiteSettings
from lodestream.agents.site.transfers.locations import BackendBuilder
from lodestream.agents.site.transfers.module import TransferModule
from lodestream.eventlog.consumers import ensure_site_consumers
from lodestream.schemas.envelope import Event
from lodestream.schemas.events import TransferRequested, TransferSubmitted, TransferSucceeded
from lodestream.schemas.ids import uuid7
from lodestream.schemas.trust import event_from_message
from tests.fixtures.sshd import require_rsync
from tests.support.running import running_until_stopped
from tests.support.staging import Item, request

SITE: Final = "alpha"
WAIT_S: Final = 60.0
ENDS: Final = frozenset({"xfer.succeeded", "xfer.failed"})
Kind = TypeVar("Kind", bound=Event)


def site_settings(tmp_path: Path, url: str, **transfers: Any) -> SiteSettings:
    return SiteSettings.model_validate({
        "site": SITE, "nats": {"url": "wss://127.0.0.1:1"}, "directory": tmp_path / "site",
        "transfers": {"locations": {"beamline": url}, **transfers},
    })  # fmt: skip


@pytest.fixture
def remote(tmp_path: Path) -> Path:
    root = tmp_path / "beamline"
    root.mkdir()
    for n in range(8):
        (root / f"f{n}.txt").write_bytes(b"x" * 1024)
    return root


@asynccontextmanager
async def running_module(
    js: JetStreamContext, settings: SiteSettings, build: BackendBuilder | None = None
) -> AsyncIterator[TransferModule]:
    """The transfer module alone, with the site's own backends unless ``build`` says."""
    await ensure_site_consumers(js, SITE)  # the controller's part, for a registered site
    module = TransferModule(js, settings, build=build)
    async with running_until_stopped(module.run):
        yield module


async def item_events(js: JetStreamContext) -> dict[uuid.UUID, list[Event]]:
    """Every ``xfer.*`` event on the log, by item, in log order."""
    sub = await js.subscribe(f"evt.{SITE}.xfer.>", ordered_consumer=True)
    found: dict[uuid.UUID, list[Event]] = {}
    try:
        while True:
            msg = await sub.next_msg(timeout=5)
            event = event_from_message(msg.subject, msg.data)
            found.setdefault(event.aggregate_id, []).append(event)
            if msg.metadata.num_pending == 0:
                return found
    finally:
        await sub.unsubscribe()


async def until_ended(js: JetStreamContext, items: list[Item]) -> dict[uuid.UUID, list[Event]]:
    async with asyncio.timeout(WAIT_S):
        while True:
            events = await item_events(js)
            if all(any(e.type in ENDS for e in events.get(i.id, [])) for i in items):
                return events
            await asyncio.sleep(0.05)


def only(events: list[Event], kind: type[Kind]) -> Kind:
    """The item's one event of ``kind``."""
    [event] = [e for e in events if isinstance(e, kind)]
    return event


@pytest.mark.parametrize("backend", ["local", "rsync"])
async def test_a_small_copy_ends_well_within_the_default_poll_interval(
    js: JetStreamContext, tmp_path: Path, remote: Path, backend: str
) -> None:
    if backend == "rsync":
        require_rsync()
    settings = site_settings(tmp_path, f"{backend}:{remote}")
    interval = settings.transfers.poll_interval_s
    assert interval == 2.0  # the site's default: what a user staging through local pays
    step, job = uuid7(), uuid.uuid4()
    items: list[Item] = []
    async with running_module(js, settings):
        # One request at a time, each once the one before has ended: the module is idle
        # (between its poll cycles) when each arrives, as for a job staged on its own.
        for n in range(4):
            spec = {"location": "beamline", "path": f"/f{n}.txt"}
            items.append(await request(js, SITE, job, f"s{n}", "in", spec, step))
            await until_ended(js, items)
    events = await until_ended(js, items)
    took = []
    for item in items:
        started = only(events[item.id], TransferRequested).occurred_at
        ended = only(events[item.id], TransferSucceeded).occurred_at
        took.append((ended - started).total_seconds())
    print(f"\n{backend}: request → succeeded, s: {', '.join(f'{t:.3f}' for t in took)} "
          f"(poll_interval_s {interval})")  # fmt: skip
    for n in range(4):
        assert (settings.data_dir / "runs" / f"s{n}").read_bytes() == b"x" * 1024
    # Before: at least one whole poll interval each (submitted at one cycle, noticed at the
    # next). Half of it leaves a wide margin for a slow machine.
    assert max(took) < interval / 2


async def test_items_delivered_together_go_in_one_task_per_location_and_direction(
    js: JetStreamContext, tmp_path: Path, remote: Path
) -> None:
    # Two task slots for two (location, direction) groups: nothing left to spread a group
    # over, so each group is one task unless its items were submitted apart.
    settings = site_settings(tmp_path, f"local:{remote}", max_concurrent=2)
    results = settings.data_dir / "runs"
    results.mkdir(parents=True)
    step, job = uuid7(), uuid.uuid4()
    items = []
    for n in range(3):
        inbound = {"location": "beamline", "path": f"/f{n}.txt"}
        items.append(await request(js, SITE, job, f"in{n}", "in", inbound, step))
        (results / f"out{n}").write_text(f"result {n}\n")
        outbound = {"location": "beamline", "path": f"/out{n}.txt"}
        items.append(await request(js, SITE, job, f"out{n}", "out", outbound, step))
    async with running_module(js, settings) as module:  # all six wait on the feed
        events = await until_ended(js, items)
    submitted = [only(events[item.id], TransferSubmitted).data for item in items]
    print(f"\ntasks: {module.stats.tasks}; items per task: "
          f"{sorted(data.items_in_task for data in submitted)}")  # fmt: skip
    assert [e.type for i in items for e in events[i.id] if e.type in ENDS] == [
        "xfer.succeeded"
    ] * len(items)
    assert len({data.task_id for data in submitted}) == 2
    assert module.stats.tasks == {"beamline": 2}
    assert {data.items_in_task for data in submitted} == {3}
    assert (remote / "out2.txt").read_text() == "result 2\n"
