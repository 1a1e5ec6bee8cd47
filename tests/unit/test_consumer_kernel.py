"""The consumer kernel's rules, with scripted deliveries and a scripted log (no server).

Every consumer of the log goes through these: what a decision's appends came to (landed,
duplicate, lost compare-and-set, not taken), how a delivery is settled, and what a failure
means (refused by the shared rule: terminated; transient: handed back; a bug: logged and
left). The consumers themselves are tested against nats-server in tests/integration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import nats.errors
import psycopg
import pytest
from nats.aio.msg import Msg
from nats.js.errors import APIError, ServiceUnavailableError

from lodestream.eventlog import Appended, AppendError, ConflictError, EventLog, Rejected
from lodestream.eventlog.errors import NotTaken, ReadError, StreamConfigError
from lodestream.eventlog.kernel import (
    ACK,
    HOLD,
    TERM,
    Append,
    BatchDecision,
    Committed,
    DeliveryCounts,
    Nak,
    Settle,
    batches,
    commit,
    deliveries,
    settle,
)
from lodestream.eventlog.transient import DUPLICATE_IN_PROCESS, transient
from lodestream.schemas.errors import Untrusted
from lodestream.services.controller.errors import ReadModelLag
from tests.support.builders import job_created


@dataclass
class Delivery:
    """A delivery that records how it was settled."""

    subject: str
    settled: list[str] = field(default_factory=list)
    fail_settling: bool = False

    async def _record(self, how: str) -> None:
        if self.fail_settling:
            raise nats.errors.ConnectionClosedError
        self.settled.append(how)

    async def ack(self) -> None:
        await self._record("ack")

    async def nak(self, delay: float | None = None) -> None:
        await self._record(f"nak {delay}" if delay else "nak")

    async def term(self) -> None:
        await self._record("term")

    async def in_progress(self) -> None:
        await self._record("in_progress")


def msgs(*deliveries_: Delivery) -> list[Msg]:
    return cast(list[Msg], list(deliveries_))


@dataclass
class ScriptedLog:
    """``append_many`` answers with one scripted outcome per append: a sequence (landed),
    "dup" (landed before) or an error."""

    outcomes: list[int | str | Exception]
    appended: list[Any] = field(default_factory=list)

    async def append_many(self, items: list[tuple[Any, int | None]]) -> list[Any]:
        self.appended.extend(items)
        results: list[Any] = []
        for (event, _), outcome in zip(items, self.outcomes, strict=True):
            if isinstance(outcome, Exception):
                results.append(Rejected(event, cast(Any, outcome)))
            else:
                seq = 7 if outcome == "dup" else int(outcome)
                results.append(Appended(event, seq, duplicate=outcome == "dup"))
        return results


def appends(n: int) -> list[Append]:
    return [Append(job_created("s", "alice"), 0) for _ in range(n)]


def conflict() -> ConflictError:
    return ConflictError("evt.s.job.x", 3, 4, "wrong last sequence")


def api_error(code: int, cls: type[APIError] = APIError) -> APIError:
    error = cls()
    error.err_code = code
    return error


def refused_append(cause: APIError) -> AppendError:
    try:
        raise AppendError("refused") from cause
    except AppendError as exc:
        return exc


# --- one classifier of transient failures -----------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (conflict(), False),  # the aggregate moved on: a refusal
        (refused_append(api_error(10077)), False),  # JetStream refused it for good
        (refused_append(api_error(503, ServiceUnavailableError)), True),
        (refused_append(api_error(DUPLICATE_IN_PROCESS)), True),  # the first try may land
        (AppendError("no answer"), True),
        (NotTaken("a decision's append"), True),
        (ReadError("not a message of the stream"), True),
        (ReadModelLag("projector behind"), True),
        (nats.errors.NoRespondersError(), True),
        (nats.errors.ConnectionClosedError(), True),
        (TimeoutError(), True),
        (ConnectionResetError(), True),
        (psycopg.OperationalError("server closed the connection"), True),
        (psycopg.InterfaceError("connection is closed"), True),
        (psycopg.DataError("invalid input"), False),  # the content, not the server
        (StreamConfigError("settings cannot change"), False),
        (ValueError("a bug"), False),
        (Untrusted("forged"), False),
    ],
)
def test_one_answer_to_may_it_pass_if_tried_again(exc: Exception, expected: bool) -> None:
    assert transient(exc) is expected


# --- commit ---------------------------------------------------------------------------------


async def test_commit_counts_landed_duplicates_and_lost_compare_and_sets() -> None:
    event_log = ScriptedLog([11, "dup", conflict(), 12])
    done = await commit(cast(EventLog, event_log), appends(4))
    assert (done.appended, done.duplicates, done.lost) == (2, 1, 1)
    assert len(event_log.appended) == 4


async def test_an_append_not_taken_raises_after_the_others_were_tried() -> None:
    refused = refused_append(api_error(10077))
    event_log = ScriptedLog([11, refused, 12])
    with pytest.raises(NotTaken) as caught:
        await commit(cast(EventLog, event_log), appends(3))
    assert caught.value.__cause__ is refused
    assert len(event_log.appended) == 3
    assert transient(caught.value)  # the delivery is decided again


async def test_nothing_to_commit_asks_nothing() -> None:
    event_log = ScriptedLog([])
    assert await commit(cast(EventLog, event_log), []) == Committed()
    assert event_log.appended == []


# --- settle ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("how", "seen"),
    [(ACK, "ack"), (Nak(2.5), "nak 2.5"), (Nak(), "nak"), (TERM, "term"), (HOLD, "in_progress")],
)
async def test_each_settlement_is_its_own_call(how: Settle, seen: str) -> None:
    delivery = Delivery("s")
    await settle(delivery, how, "test")
    assert delivery.settled == [seen]


async def test_nats_away_while_settling_is_only_logged(caplog: pytest.LogCaptureFixture) -> None:
    await settle(Delivery("s", fail_settling=True), ACK, "test")
    assert "could not settle" in caplog.text


# --- one delivery at a time ------------------------------------------------------------------


async def test_each_delivery_is_settled_as_decided_and_none_stops_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def decide(msg: Msg) -> Settle | None:
        match msg.subject:
            case "forged":
                raise Untrusted("not this site's")
            case "nats away":
                raise nats.errors.NoRespondersError
            case "bug":
                raise KeyError("a bug")
            case "held":
                return None  # kept for work in progress, settled later
            case "later":
                return Nak(3.0)
        return ACK

    counts = DeliveryCounts()
    batch = [Delivery(s) for s in ("ok", "forged", "nats away", "bug", "held", "later", "ok2")]
    await deliveries(decide, "test", retry_s=1.5, counts=counts)(msgs(*batch))
    assert {d.subject: d.settled for d in batch} == {
        "ok": ["ack"],
        "forged": ["term"],  # never redelivered
        "nats away": ["nak 1.5"],  # handed back for another try
        "bug": [],  # left: redelivered after the ack wait, and logged
        "held": [],
        "later": ["nak 3.0"],
        "ok2": ["ack"],
    }
    assert (counts.refused, counts.retried, counts.failed) == (1, 1, 1)
    assert "KeyError" in caplog.text


# --- a batch at once ----------------------------------------------------------------------------


async def test_a_batch_is_acked_only_after_its_appends_and_what_it_learnt_follows_them() -> None:
    order: list[str] = []
    event_log = ScriptedLog([11, 12])

    async def decide(batch: list[Msg]) -> BatchDecision:
        return BatchDecision(appends(2), then=lambda: order.append("learnt"))

    async def recover() -> None:
        order.append("recovered")

    committed, counts = Committed(), DeliveryCounts()
    batch = [Delivery("a"), Delivery("b")]
    handle = batches(decide, cast(EventLog, event_log), "test", committed=committed,
                     counts=counts, recover=recover, retry_s=0)  # fmt: skip
    await handle(msgs(*batch))
    assert [d.settled for d in batch] == [["ack"], ["ack"]]
    assert committed.appended == 2
    assert order == ["learnt"]


async def test_a_transient_failure_leaves_the_batch_unacked_and_unlearnt() -> None:
    order: list[str] = []
    event_log = ScriptedLog([11, refused_append(api_error(10077))])

    async def decide(batch: list[Msg]) -> BatchDecision:
        return BatchDecision(appends(2), then=lambda: order.append("learnt"))

    async def recover() -> None:
        order.append("recovered")

    counts = DeliveryCounts()
    batch = [Delivery("a")]
    handle = batches(decide, cast(EventLog, event_log), "test", committed=Committed(),
                     counts=counts, recover=recover, retry_s=0)  # fmt: skip
    await handle(msgs(*batch))
    assert batch[0].settled == []  # redelivered after the ack wait, decided again
    assert order == ["recovered"]  # not "learnt": the next try must find it again
    assert counts.retried == 1


async def test_a_bug_in_a_batch_decision_is_not_taken_for_an_outage() -> None:
    async def decide(batch: list[Msg]) -> BatchDecision:
        raise KeyError("a bug")

    async def recover() -> None:
        raise AssertionError("not an outage")

    handle = batches(decide, cast(EventLog, ScriptedLog([])), "test", committed=Committed(),
                     counts=DeliveryCounts(), recover=recover, retry_s=0)  # fmt: skip
    with pytest.raises(KeyError):
        await handle(msgs(Delivery("a")))
