"""The chaos workload: short jobs with small DAG chains, submitted in waves through outages."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from nats.js import JetStreamContext

from lodestream.eventlog import Appended, ConflictError, EventLog
from lodestream.eventlog.append import H_MSG_ID
from lodestream.schemas.envelope import Event
from lodestream.schemas.events import JobCreated
from lodestream.schemas.subjects import EVENTS_STREAM
from tests.support.builders import job_created
from tests.support.chaos import ChaosPlan

log = logging.getLogger(__name__)
APP = "chaos"  # tests/chaos/apps/chaos_marker.py
CHAIN = 3  # parent → child → grandchild


@dataclass
class Wave:
    """Jobs submitted together, by depth: a level is appended once the one above it is in."""

    levels: list[list[JobCreated]] = field(default_factory=lambda: [[] for _ in range(CHAIN)])

    @property
    def jobs(self) -> list[JobCreated]:
        return [job for level in self.levels for job in level]


def workload(plan: ChaosPlan, site: str, owner: str, waves: int) -> list[Wave]:
    """``plan.jobs`` jobs in ``waves`` waves; every ``chain_every``-th job heads a chain."""
    out = [Wave() for _ in range(max(waves, 1))]
    made = 0
    while made < plan.jobs:
        wave = out[made * len(out) // plan.jobs]
        length = CHAIN if made % plan.chain_every == 0 else 1
        parent: JobCreated | None = None
        for depth in range(min(length, plan.jobs - made)):
            seconds = plan.run_s[made % len(plan.run_s)]
            job = job_created(
                site, owner, app=APP, workdir=f"chaos/{made}",
                parameters={"seconds": f"{seconds:g}"},
                parent_ids=(parent.aggregate_id,) if parent else (),
            )  # fmt: skip
            wave.levels[depth].append(job)
            parent = job
            made += 1
    return out


@dataclass
class Submitted:
    """How submission went: retried appends, and appends that landed unacknowledged."""

    retries: int = 0
    # The first append was stored but its ack lost; the retry then lost its compare-and-set
    # because the controller had already moved the job on (the event log does not recognise
    # its own retry once the aggregate has moved: see the report).
    landed_unacknowledged: list[str] = field(default_factory=list)


async def append_until_stored(
    js: JetStreamContext, jobs: list[JobCreated], timeout_s: float, outcome: Submitted
) -> None:
    """Append ``job.created`` events until each is on the log.

    Through a NATS outage appends time out; the retry carries the same event id, and
    one that did land the first time is found on the log, never stored twice.
    """
    events = EventLog(js)
    pending = list(jobs)
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                results = await events.append_many([(job, 0) for job in pending])
            except Exception as exc:  # a whole batch timed out while NATS was away
                log.info("submit: %d appends unacknowledged (%r); retrying", len(pending), exc)
                results = []
            stored = {r.event.id for r in results if isinstance(r, Appended)}
            for result in results:
                if not isinstance(result, Appended) and isinstance(result.error, ConflictError):
                    if await on_log(js, result.event):
                        stored.add(result.event.id)
                        outcome.landed_unacknowledged.append(str(result.event.aggregate_id))
                    else:
                        log.warning("submit: %s: %s", result.event.aggregate_id, result.error)
            pending = [job for job in pending if job.id not in stored]
            if not pending:
                return
            outcome.retries += len(pending)
            await asyncio.sleep(0.5)


async def on_log(js: JetStreamContext, job: Event) -> bool:
    """Whether this very ``job.created`` (same event id) is stored; there is one per job."""
    try:
        stored = await js.get_msg(EVENTS_STREAM, subject=job.subject, direct=True)
    except Exception:
        return False
    return bool((stored.headers or {}).get(H_MSG_ID) == str(job.id))


async def submit_waves(
    js: JetStreamContext, waves: list[Wave], spacing_s: float, timeout_s: float
) -> Submitted:
    """Submit each wave ``spacing_s`` after the previous."""
    outcome = Submitted()
    for i, wave in enumerate(waves):
        if i:
            await asyncio.sleep(spacing_s)
        for level in wave.levels:
            if level:
                await append_until_stored(js, level, timeout_s, outcome)
    return outcome
