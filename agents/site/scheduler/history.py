"""A batch job as the log has it, read with the only read a site key may make.

A site may direct-get the newest message of each of its own subjects, by subject. A batch
job's subjects are one per event type, so asking each gives the newest event of every type;
folded in sequence order they give the :class:`~lodestream.schemas.batch.BatchView` the
module acts on (what it submitted, what the scheduler was last seen to do, whether a deletion
was asked for, and the sequence to chain on). Each stored event is checked with the shared
rule, like a delivery: one the rule refuses is left out and logged.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from lodestream.agents.site.newest import newest_event
from lodestream.schemas.batch import BATCH_TRANSITIONS, BatchView, fold_batch
from lodestream.schemas.subjects import event_subject


async def read_batch_job(js: Any, site: str, batch_id: uuid.UUID) -> BatchView | None:
    """The batch job's view from the log; None if it was never requested. NATS errors raise."""
    found = await asyncio.gather(*(
        newest_event(js, event_subject(site, event_type, batch_id), site)
        for event_type in BATCH_TRANSITIONS
    ))  # fmt: skip
    return fold_batch(pair for pair in found if pair is not None)
