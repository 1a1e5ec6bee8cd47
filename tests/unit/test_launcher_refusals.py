"""A pilot's refusal of a job: the event it appends, chained on the delivery, once."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import cast

from lodestream.agents.launcher.refusals import note_refusal, placement_refused
from lodestream.agents.launcher.work import WorkItem, work_item
from lodestream.eventlog import ConflictError, EventLog
from lodestream.eventlog.append import Appended
from lodestream.schemas.codec import encode
from lodestream.schemas.envelope import Event
from lodestream.schemas.events.job import JobPlacementRefused
from lodestream.schemas.fold import JobView, apply
from lodestream.schemas.resources import JobSpec
from lodestream.schemas.states import JobState

SITE = "alpha"
JOB = uuid.UUID(int=7)
SESSION = uuid.UUID(int=9)
SPEC = JobSpec(site=SITE, app="demo", workdir="demo/1", num_nodes=2)
ITEM = WorkItem(site=SITE, job_id=JOB, seq=41, spec=SPEC, attempt=2, msg=None)
REASON = "needs 2 nodes; this pilot has 1"


@dataclass
class Log:
    """An event log whose next answers are scripted: a sequence or an error."""

    answers: list[int | BaseException]
    appended: list[tuple[Event, int | None]] = field(default_factory=list)

    async def append(self, event: Event, *, expect: int | None) -> Appended:
        self.appended.append((event, expect))
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return Appended(event, answer, duplicate=False)


def refusal(item: WorkItem = ITEM) -> JobPlacementRefused:
    return placement_refused(item, session_id=SESSION, actor=f"launcher:{SESSION}", reason=REASON)


def test_the_refusal_carries_the_work_so_a_pilot_that_fits_leases_on_it() -> None:
    event = refusal()
    metadata = SimpleNamespace(sequence=SimpleNamespace(stream=42))
    msg = SimpleNamespace(subject=event.subject, data=encode(event), metadata=metadata)
    again = work_item(msg, SITE)
    assert (again.job_id, again.seq, again.spec, again.attempt) == (JOB, 42, SPEC, 2)
    assert again.refused
    assert not ITEM.refused
    assert event.data.reason == REASON
    assert event.data.session_id == SESSION


def test_the_refusal_keeps_the_job_runnable_and_free() -> None:
    view = JobView(id=JOB, site=SITE, state=JobState.PREPROCESSED, last_seq=41)
    after = apply(view, refusal(), 42)
    assert (after.state, after.lease_seq, after.last_seq) == (JobState.PREPROCESSED, None, 42)


def test_every_pilot_refusing_one_delivery_mints_the_same_event() -> None:
    assert refusal().id == refusal().id
    assert refusal().id != refusal(replace(ITEM, seq=43)).id


async def test_a_refusal_lands_chained_on_the_delivery() -> None:
    log = Log([42])
    assert await note_refusal(cast(EventLog, log), ITEM, session_id=SESSION, actor="launcher:x",
                              reason=REASON)  # fmt: skip
    ((event, expect),) = log.appended
    assert expect == ITEM.seq
    assert event.type == "job.placement_refused"


async def test_a_refusal_that_meets_another_settles_the_delivery_too() -> None:
    log = Log([ConflictError(refusal().subject, 41, 43, "moved on")])
    assert await note_refusal(cast(EventLog, log), ITEM, session_id=SESSION, actor="launcher:x",
                              reason=REASON)  # fmt: skip


async def test_a_refusal_the_log_refuses_hands_the_delivery_back() -> None:
    log = Log([ValueError("garbled")])
    settled = await note_refusal(
        cast(EventLog, log), ITEM, session_id=SESSION, actor="launcher:x", reason=REASON
    )
    assert not settled
