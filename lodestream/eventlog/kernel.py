"""The consumer kernel: what every consumer of the log does with a delivery, in one place.

A consumer is a row of the topology table (``schemas/topology.py``: the stream, the durable,
the event types it carries), a decision, and this kernel around them:

1. **fetch** a batch (:class:`~lodestream.eventlog.pull.PullLoop`);
2. **decide**: the consumer decodes with the shared rule and says what follows, as
   :class:`Append` values (an event and the sequence its compare-and-set expects) and how
   the delivery is to be settled (a :data:`Settle`);
3. **commit** the appends (:func:`commit`): the one place that tells a landed append from a
   duplicate (an earlier try landed) and a lost compare-and-set (the aggregate moved on:
   nothing left to do), and raises when JetStream did not take one;
4. **settle** the delivery (:func:`settle`): ack, nak with a delay, term, or hold it
   (``in_progress``) while the work goes on.

What a delivery meets is classified once: a refusal by the shared rule
(:class:`~lodestream.schemas.errors.Untrusted`) terminates it, so it is never redelivered;
a failure :func:`~lodestream.eventlog.transient.transient` names leaves it for another
try; anything else is logged and left unsettled (redelivered after the ack wait), and no
delivery ends the consumer. Batches (:func:`batches`) and single deliveries
(:func:`deliveries`) are the two shapes; the controller decides a batch at once, the
site's modules one delivery at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import nats.errors
from nats.aio.msg import Msg

from lodestream.eventlog.append import Appended, EventLog
from lodestream.eventlog.errors import ConflictError, EventLogError, NotTaken
from lodestream.eventlog.pull import BatchHandler, PullConsumer
from lodestream.eventlog.transient import transient
from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import Untrusted, first_line

log = logging.getLogger(__name__)


# --- what a decision says -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Append:
    """An event to append, chained on ``expect`` (the aggregate's last sequence the decision
    read; None: no compare-and-set, the event's id alone makes a retry safe)."""

    event: Event
    expect: int | None


@dataclass(frozen=True, slots=True)
class Ack:
    """Done: never deliver it again."""


@dataclass(frozen=True, slots=True)
class Nak:
    """Not now: deliver it again after ``delay_s`` (0: at once)."""

    delay_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Term:
    """Never again, and not done: a delivery that is no work of this consumer."""


@dataclass(frozen=True, slots=True)
class Hold:
    """Still working on it: restart the ack wait (``in_progress``), so nobody else gets it."""


Settle = Ack | Nak | Term | Hold
ACK: Final = Ack()
TERM: Final = Term()
HOLD: Final = Hold()


@dataclass(frozen=True, slots=True)
class Decision:
    """What one delivery leads to: its appends, then how it is settled."""

    appends: tuple[Append, ...] = ()
    settle: Settle = ACK


# --- commit -----------------------------------------------------------------------------


@dataclass(slots=True)
class Committed:
    """What became of a decision's appends."""

    appended: int = 0
    duplicates: int = 0  # an earlier try of the same append had landed
    lost: int = 0  # compare-and-set lost: the aggregate moved on, nothing left to do

    def add(self, other: Committed) -> None:
        self.appended += other.appended
        self.duplicates += other.duplicates
        self.lost += other.lost


async def commit(event_log: EventLog, appends: Sequence[Append]) -> Committed:
    """Append all, in order; count what landed, what had landed before and what lost its
    compare-and-set.

    Any other refusal raises :class:`NotTaken` (for the first one, once every outcome is
    counted): JetStream did not take that append (no responders, no leader while a cluster
    elects one), so the delivery that caused it must stay unsettled and be decided again.
    Deciding again is safe: the same event ids and expected sequences, and an append that
    did land comes back as a duplicate. A lost compare-and-set means "nothing to do":
    another writer moved the aggregate on, or an earlier try of this very append landed
    and could not be told apart.
    """
    done = Committed()
    if not appends:
        return done
    results = await event_log.append_many([(a.event, a.expect) for a in appends])
    not_taken: EventLogError | None = None
    for result in results:
        if isinstance(result, Appended):
            if result.duplicate:
                done.duplicates += 1
            else:
                done.appended += 1
        elif isinstance(result.error, ConflictError):
            done.lost += 1
            log.debug("lost compare-and-set: %s", result.error)
        else:
            not_taken = not_taken or result.error
    if not_taken is not None:
        raise NotTaken(str(not_taken)) from not_taken
    return done


class Appender(Protocol):
    """What :func:`commit_one` appends through: :class:`EventLog`, or a writer like it."""

    async def append(self, event: Event, *, expect: int | None) -> Appended: ...


async def commit_one(event_log: Appender, append: Append) -> Appended | None:
    """Append one; None if it lost its compare-and-set (the aggregate moved on)."""
    try:
        return await event_log.append(append.event, expect=append.expect)
    except ConflictError as exc:
        log.debug("lost compare-and-set: %s", exc)
        return None


# --- settle -----------------------------------------------------------------------------


async def settle(msg: Any, how: Settle, name: str) -> None:
    """Ack, nak, term or hold a delivery. If NATS is away the server redelivers it later,
    which compare-and-set makes safe, so a failure is only logged."""
    try:
        match how:
            case Ack():
                await msg.ack()
            case Nak(delay_s=delay):
                await msg.nak(delay=delay) if delay > 0 else await msg.nak()
            case Term():
                await msg.term()
            case Hold():
                await msg.in_progress()
    except nats.errors.Error as exc:
        log.warning("%s: could not settle a delivery: %s", name, exc or type(exc).__name__)


async def hand_back(sub: PullConsumer, held: Iterable[Msg], name: str) -> None:
    """Stopping: give the deliveries ``held`` back (nak) for the next reader, at once.

    The subscription is stopped first. A pull request of ours may still be open on the server
    (until its expiry); a nak sent while its inbox is subscribed is delivered straight back
    into it, and so to nobody, until the feed's ack wait runs out (two minutes for the
    site's transfers). Once the inbox has no interest, the server sends it to the next
    reader instead (measured against nats-server: at once, against not within 8 s).
    """
    with contextlib.suppress(nats.errors.Error):
        await sub.stop()
    for msg in held:
        await settle(msg, Nak(), name)


# --- the two shapes of a consumer ---------------------------------------------------------

DeliveryDecide = Callable[[Msg], Awaitable[Settle | None]]
"""Decide one delivery: how to settle it, or None when the consumer keeps it (held for
work in progress, or already settled by the work)."""


@dataclass(slots=True)
class DeliveryCounts:
    """What a consumer's deliveries came to, for its log line at exit and its tests."""

    refused: int = 0  # refused by the shared rule: terminated
    retried: int = 0  # met a transient failure: left for another try
    failed: int = 0  # met anything else: logged, redelivered after the ack wait


def deliveries(
    decide: DeliveryDecide, name: str, *, retry_s: float, counts: DeliveryCounts | None = None
) -> BatchHandler:
    """A batch handed on delivery by delivery, each settled as it was decided.

    A delivery the shared rule refuses is terminated, one that meets a transient failure is
    handed back for ``retry_s``, and one that meets anything else is logged and left
    unsettled: no delivery stops the others or the consumer.
    """
    kept = counts if counts is not None else DeliveryCounts()

    async def handle_each(msgs: list[Msg]) -> None:
        for msg in msgs:
            await deliver_one(decide, msg, name, retry_s=retry_s, counts=kept)

    return handle_each


async def deliver_one(
    decide: DeliveryDecide, msg: Msg, name: str, *, retry_s: float, counts: DeliveryCounts
) -> None:
    """Decide one delivery and settle it as decided (see :func:`deliveries`)."""
    try:
        how = await decide(msg)
    except Untrusted as exc:
        counts.refused += 1
        log.warning("%s: refused delivery on %s: %s", name, msg.subject, exc)
        how = TERM
    except Exception as exc:
        if not transient(exc):
            counts.failed += 1
            log.exception("%s: delivery on %s not handled", name, msg.subject)
            return
        counts.retried += 1
        log.warning("%s: %s not handled (%s); again in %g s", name, msg.subject,
                    first_line(exc), retry_s)  # fmt: skip
        how = Nak(retry_s)
    if how is not None:
        await settle(msg, how, name)


@dataclass(frozen=True, slots=True)
class BatchDecision:
    """What a batch leads to: its appends, and what the consumer learns once they are
    committed (not before: a batch that fails is decided again and must find what it
    found the first time)."""

    appends: Sequence[Append]
    then: Callable[[], None] | None = None


BatchDecide = Callable[[list[Msg]], Awaitable[BatchDecision]]


def batches(
    decide: BatchDecide,
    event_log: EventLog,
    name: str,
    *,
    committed: Committed,
    counts: DeliveryCounts,
    recover: Callable[[], Awaitable[None]],
    retry_s: float = 0.5,
) -> BatchHandler:
    """A batch decided at once: its appends committed, then every delivery acked.

    A transient failure leaves the whole batch unacked (it comes back after the ack wait,
    and deciding it again yields the same events: nothing is lost and nothing appended
    twice), calls ``recover`` (drop a broken connection) and waits ``retry_s``. Anything
    else ends the consumer: a batch decision is the consumer's own code, and its supervisor
    restarts it with the batch still unacked.
    """

    async def handle(msgs: list[Msg]) -> None:
        try:
            decided = await decide(msgs)
            committed.add(await commit(event_log, decided.appends))
            if decided.then is not None:
                decided.then()
            for msg in msgs:
                await msg.ack()
        except Exception as exc:
            if not transient(exc):
                raise
            counts.retried += 1
            log.warning("%s: %s; will retry", name, first_line(exc))
            await recover()
            await asyncio.sleep(retry_s)

    return handle
