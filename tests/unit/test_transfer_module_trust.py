"""The site's transfer module checks every delivery with the shared rule before acting: a
garbled message, another site's item and an event a site may not be handed as work are each
terminated (never redelivered), counted and logged, and nothing is held or appended."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pytest
from nats.aio.msg import Msg

from lodestream.agents.site.settings import SiteSettings
from lodestream.agents.site.transfers.module import TransferModule
from lodestream.schemas.codec import encode
from lodestream.schemas.envelope import Event
from lodestream.schemas.events import TransferRequested, TransferSucceeded
from lodestream.schemas.events.xfer import TransferRequestedData
from lodestream.schemas.resources import TransferSpec


@dataclass
class RecordingDelivery:
    """A delivery as the pull consumer hands it over, recording how it is settled (no NATS:
    these deliveries are refused before the module could touch the log)."""

    subject: str
    data: bytes
    settled: list[str] = field(default_factory=list)

    async def term(self) -> None:
        self.settled.append("term")

    async def ack(self) -> None:
        self.settled.append("ack")

    async def nak(self, delay: float | None = None) -> None:
        self.settled.append("nak")


def of(event: Event) -> RecordingDelivery:
    return RecordingDelivery(event.subject, encode(event))


def requested(site: str, actor: str = "controller:main") -> Event:
    data = TransferRequestedData(
        job_id=uuid.uuid4(), slot="raw", direction="in", local_path="w/raw",
        remote=TransferSpec(location="dtn", path="/raw"), step_id=uuid.uuid4(),
    )  # fmt: skip
    return TransferRequested.create(site=site, aggregate_id=uuid.uuid4(), actor=actor, data=data)


@pytest.fixture
def module(tmp_path: Path) -> TransferModule:
    settings = SiteSettings.model_validate(
        {"site": "alpha", "nats": {"url": "wss://127.0.0.1:1"}, "directory": tmp_path}
    )
    return TransferModule(None, settings)


@pytest.mark.parametrize(
    "delivery",
    [
        RecordingDelivery(f"evt.alpha.xfer.{uuid.uuid4()}.requested", b"\xff not json"),
        of(requested("beta")),  # another site's item: the rule's own-site check
        RecordingDelivery(  # a beta item on an alpha subject
            f"evt.alpha.xfer.{uuid.uuid4()}.requested", encode(requested("beta"))
        ),
        of(requested("alpha", actor="site:alpha")),  # a site may not request items
        of(TransferSucceeded.create(site="alpha", aggregate_id=uuid.uuid4(), actor="site:alpha")),
    ],
    ids=["garbled", "other-site", "subject-mismatch", "forged-writer", "not-work"],
)
async def test_a_delivery_the_rule_refuses_is_terminated_counted_and_changes_nothing(
    module: TransferModule, delivery: RecordingDelivery
) -> None:
    await module.consume(cast(list[Msg], [delivery]))  # as the pull loop hands it over
    assert delivery.settled == ["term"]
    assert module.stats.deliveries.refused == 1
    assert module.held == {}
    assert module.stats.submitted == module.stats.failed == 0
