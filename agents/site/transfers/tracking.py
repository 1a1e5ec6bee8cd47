"""What the transfer module keeps about the work in its hands: each held item, each task in
flight, and its counters (:mod:`.module` does the work)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from lodestream.agents.site.transfers import plan
from lodestream.agents.site.transfers.history import ItemView
from lodestream.eventlog.kernel import DeliveryCounts


@dataclass(slots=True)
class Held:
    """An item between its request and its end: its view and the delivery held for it."""

    view: ItemView
    msg: Any
    pending: plan.PendingItem | None = None  # waiting for a task
    task_id: str | None = None
    submit_errors: int = 0
    submitted_mono: float = 0.0


@dataclass(slots=True)
class InFlight:
    task_id: str
    location: str
    items: list[uuid.UUID]
    submitted_mono: float = 0.0
    polled_mono: float = 0.0  # its last poll (a quick backend's task is polled between cycles)


@dataclass(slots=True)
class TransferStats:
    submitted: int = 0  # items submitted (every attempt)
    succeeded: int = 0
    failed: int = 0
    retried: int = 0  # attempts after a transient fault
    backend_errors: int = 0  # submit or poll calls that failed
    deliveries: DeliveryCounts = field(default_factory=DeliveryCounts)  # refused, retried, failed
    resumed: int = 0  # items found already submitted (a redelivery)
    cache_hits: int = 0  # items served from the site's stage cache
    cache_waits: int = 0  # items that waited for the same source already being fetched
    tasks: dict[str, int] = field(default_factory=dict)  # tasks submitted per location
