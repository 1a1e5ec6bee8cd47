"""A retried compare-and-set append that had landed is recognised, even by a replica behind.

The retry of an append whose acknowledgement was lost conflicts with the append itself; the
log asks the stream whether the aggregate's newest event is its own. Direct gets are answered
by any replica, and one cut off by a partition answers from what it holds while it catches up:
its "no" must not count (a lease that had landed was once dropped so, in the partition test).
"""

from __future__ import annotations

from typing import Any

import pytest
from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg

from lodestream.eventlog import ConflictError, EventLog
from lodestream.schemas.envelope import Event
from lodestream.schemas.ids import uuid7
from lodestream.schemas.subjects import EVENTS_STREAM
from tests.support.builders import job_created, lifecycle


class ReplicaBehind:
    """A stand-in for a stream replica that has not yet stored the newest events: a real one
    cannot be produced on demand on one server. It answers the first ``stale`` direct gets
    of an aggregate with what the real server held before (``before``), then passes them on."""

    def __init__(self, js: JetStreamContext, before: RawStreamMsg, stale: int) -> None:
        self._js = js
        self._before = before
        self.stale = stale
        self.asked = 0

    async def publish(self, *args: Any, **kwargs: Any) -> Any:
        return await self._js.publish(*args, **kwargs)

    async def get_msg(self, stream: str, *, subject: str, direct: bool) -> RawStreamMsg:
        if subject.endswith(".*"):  # the aggregate's newest event, whatever its type
            self.asked += 1
            if self.asked <= self.stale:
                return self._before
        return await self._js.get_msg(stream, subject=subject, direct=direct)


async def landed_lease(js: JetStreamContext) -> tuple[Event, int, int, RawStreamMsg]:
    """A job leased; the lease, the sequence it expected, its own, and the newest before it."""
    created = job_created("alpha", "ada")
    preprocessed, started, *_ = lifecycle(created)
    log = EventLog(js)
    created_seq = (await log.append(created, expect=0)).seq
    expect = (await log.append(preprocessed, expect=created_seq)).seq
    before = await js.get_msg(EVENTS_STREAM, subject=started.aggregate_subjects, direct=True)
    seq = (await log.append(started, expect=expect)).seq
    return started, expect, seq, before


async def test_a_retry_of_a_landed_append_is_its_first_landing(js: JetStreamContext) -> None:
    started, expect, seq, _ = await landed_lease(js)

    again = await EventLog(js).append(started, expect=expect)

    assert (again.seq, again.duplicate) == (seq, True)


async def test_a_replica_behind_is_asked_again_until_it_holds_the_conflict(
    js: JetStreamContext,
) -> None:
    started, expect, seq, before = await landed_lease(js)
    behind = ReplicaBehind(js, before, stale=3)

    again = await EventLog(behind).append(started, expect=expect)  # type: ignore[arg-type]

    assert (again.seq, again.duplicate) == (seq, True)
    assert behind.asked == 4


async def test_a_replica_that_stays_behind_gives_the_conflict(js: JetStreamContext) -> None:
    started, expect, _, before = await landed_lease(js)
    behind = ReplicaBehind(js, before, stale=100)

    with pytest.raises(ConflictError):
        await EventLog(behind).append(started, expect=expect)  # type: ignore[arg-type]
    assert behind.asked == 7  # the first ask and six more, about 3 s in all


async def test_another_writers_event_is_a_conflict_at_once(js: JetStreamContext) -> None:
    started, expect, seq, _ = await landed_lease(js)
    rival = started.model_copy(update={"id": uuid7()})
    behind = ReplicaBehind(js, await js.get_msg(EVENTS_STREAM, subject=started.subject), 0)

    with pytest.raises(ConflictError) as caught:
        await EventLog(behind).append(rival, expect=expect)  # type: ignore[arg-type]
    assert behind.asked == 1  # the replica holds the conflict's sequence: no second ask
    assert caught.value.actual == seq
