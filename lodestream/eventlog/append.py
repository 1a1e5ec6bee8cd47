"""Appending to the log with per-aggregate compare-and-set.

``expect`` is the stream sequence of the last event of the aggregate the
writer acted on (0 for "this aggregate must not exist yet"). The server
checks it against ``evt.<site>.<kind>.<id>.*`` atomically, so two writers
racing on one job cannot both win; the loser gets :class:`ConflictError`.
``Nats-Msg-Id`` is the event id, so a retried append is a free no-op.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import PubAck, RawStreamMsg
from nats.js.errors import APIError, NoStreamResponseError

from lodestream.eventlog.errors import AppendError, ConflictError, EventLogError
from lodestream.eventlog.jetstream import JetStream
from lodestream.eventlog.wire import (
    H_EXPECTED_STREAM,
    H_EXPECTED_SUBJECT,
    H_EXPECTED_SUBJECT_SEQ,
    H_MSG_ID,
    Outgoing,
    headers_for,
)
from lodestream.schemas.codec import encode
from lodestream.schemas.envelope import Event
from lodestream.schemas.subjects import EVENTS_STREAM

# The header names and headers_for moved to wire.py with Outgoing; importers keep this path.
__all__ = [
    "H_EXPECTED_STREAM",
    "H_EXPECTED_SUBJECT",
    "H_EXPECTED_SUBJECT_SEQ",
    "H_MSG_ID",
    "Appended",
    "EventLog",
    "Rejected",
    "appended_seq",
    "headers_for",
]

WRONG_LAST_SEQUENCE = 10071
_ACTUAL_SEQ = re.compile(r"(\d+)\s*$")
# The pauses of appended_seq between asks of a replica behind the conflict (about 3 s in all).
_CATCH_UP_WAITS_S: Final = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)


@dataclass(frozen=True, slots=True)
class Appended:
    event: Event
    seq: int
    duplicate: bool


@dataclass(frozen=True, slots=True)
class Rejected:
    event: Event
    error: EventLogError


class EventLog:
    """Typed appends to the ``EVENTS`` stream."""

    def __init__(self, js: JetStreamContext, *, timeout_s: float = 5.0) -> None:
        self._js = js
        self._timeout_s = timeout_s

    async def append(self, event: Event, *, expect: int | None) -> Appended:
        """Append one event; raise ConflictError if the aggregate moved past ``expect``."""
        try:
            ack = await self._js.publish(
                event.subject,
                encode(event),
                timeout=self._timeout_s,
                headers=headers_for(event, expect),
            )
        except APIError as exc:
            error = _map_api_error(event, expect, exc)
            if isinstance(error, ConflictError):
                retried = await self._already_appended(event, error)
                if retried is not None:
                    return retried
            raise error from exc
        except (NatsTimeoutError, NoStreamResponseError) as exc:
            raise AppendError(f"no acknowledgement for {event.subject}: {exc!r}") from exc
        return Appended(event, ack.seq, bool(ack.duplicate))

    async def append_many(
        self, items: Sequence[tuple[Event, int | None]]
    ) -> list[Appended | Rejected]:
        """Pipeline many appends (``publish_async``) and collect one outcome per item, in order.

        Appends to different aggregates are independent: one conflict does not
        stop the others, and the caller decides what a partial result means.
        """
        futures: list[asyncio.Future[PubAck]] = []
        for event, expect in items:
            futures.append(
                await self._js.publish_async(
                    event.subject, encode(event), headers=headers_for(event, expect)
                )
            )
        return await self._outcomes(items, futures)

    async def append_batch(self, messages: Sequence[Outgoing]) -> list[Appended | Rejected]:
        """:meth:`append_many` for appends already encoded (:class:`Outgoing`), in few writes.

        For large batches (a bulk submission): the messages go out through
        :meth:`JetStream.publish_batch`, where the context is lodestream's own, and with the
        same outcomes as :meth:`append_many`. nats-py's errors when the connection cannot
        take the batch (closed, or a message over ``max_payload``) propagate, as from
        :meth:`append_many`; with lodestream's context nothing was sent then.
        """
        if not isinstance(self._js, JetStream):  # a plain nats-py context: one at a time
            futures = [
                await self._js.publish_async(
                    m.subject, m.payload, headers=headers_for(m.event, m.expect)
                )
                for m in messages
            ]
        else:
            futures = await self._js.publish_batch(messages)
        return await self._outcomes([(m.event, m.expect) for m in messages], futures)

    async def _outcomes(
        self,
        items: Sequence[tuple[Event, int | None]],
        futures: Sequence[asyncio.Future[PubAck]],
    ) -> list[Appended | Rejected]:
        """One outcome per item, in order, from the ack futures of its publish."""
        done = await asyncio.wait_for(
            asyncio.gather(*futures, return_exceptions=True),
            timeout=self._timeout_s + 0.001 * len(items),
        )
        results: list[Appended | Rejected] = []
        for (event, expect), outcome in zip(items, done, strict=True):
            if isinstance(outcome, PubAck):
                results.append(Appended(event, outcome.seq, bool(outcome.duplicate)))
            elif isinstance(outcome, APIError):
                error = _map_api_error(event, expect, outcome)
                retried = (
                    await self._already_appended(event, error)
                    if isinstance(error, ConflictError)
                    else None
                )
                results.append(retried if retried is not None else Rejected(event, error))
            else:
                results.append(Rejected(event, AppendError(f"{event.subject}: {outcome!r}")))
        return results

    async def _already_appended(self, event: Event, conflict: ConflictError) -> Appended | None:
        """Recognise a retry of an append that already landed.

        The server checks the expected sequence before de-duplicating, so a
        retried CAS append reports a conflict. If the aggregate's newest event
        carries our ``Nats-Msg-Id``, the append did happen: report it as a
        duplicate, which also makes retries safe after the duplicate window.
        Callers need not ask again: a conflict this returns None for is not theirs.
        """
        # A conflict that names no sequence can still be told ours, but not waited on.
        seq = await appended_seq(self._js, event, newest_at_least=conflict.actual)
        return Appended(event, seq, duplicate=True) if seq is not None else None


async def appended_seq(
    js: JetStreamContext, event: Event, *, newest_at_least: int | None = None
) -> int | None:
    """The stream sequence at which ``event`` itself was appended, if it is the newest
    message on its subject (None if it is not, or the server cannot say now).

    ``newest_at_least``: the aggregate's newest sequence, as a conflict named it. Direct gets
    are answered by any replica, and one that was cut off answers from what it has stored
    while it catches up: in a partition test a lease that had landed was reported as lost by
    such a replica, and its job stayed RUNNING under a pilot that never ran it. So a "no" counts
    only from a replica that holds the aggregate up to that sequence; one behind it is asked
    again, for about 3 s, before the answer is "no".
    """
    if newest_at_least is None:
        return await _newest_on_subject(js, event)
    for wait_s in (*_CATCH_UP_WAITS_S, None):
        newest = await _newest_of_aggregate(js, event)
        if newest is not None and (newest.headers or {}).get(H_MSG_ID) == str(event.id):
            return int(newest.seq or 0)
        if newest is not None and (newest.seq or 0) >= newest_at_least:
            # This replica has the conflict's sequence: ours is older, or it never landed.
            return await _newest_on_subject(js, event)
        if wait_s is None:
            return None
        await asyncio.sleep(wait_s)
    return None


async def _newest_of_aggregate(js: JetStreamContext, event: Event) -> RawStreamMsg | None:
    """The newest message of ``event``'s aggregate, whatever its type (None: none, or the
    server cannot say now)."""
    try:
        return await js.get_msg(EVENTS_STREAM, subject=event.aggregate_subjects, direct=True)
    except (APIError, NatsTimeoutError):
        return None


async def _newest_on_subject(js: JetStreamContext, event: Event) -> int | None:
    try:
        # The newest message on the event's own subject (its type, at its aggregate), asked
        # by subject: a site may direct-get only its own subjects
        # ($JS.API.DIRECT.GET.EVENTS.evt.<site>.>), never by sequence. Not the aggregate's
        # newest: others may have appended after ours landed (the controller's next step).
        stored = await js.get_msg(EVENTS_STREAM, subject=event.subject, direct=True)
    except (APIError, NatsTimeoutError):
        return None
    if stored.seq is not None and (stored.headers or {}).get(H_MSG_ID) == str(event.id):
        return int(stored.seq)
    return None


def _map_api_error(event: Event, expect: int | None, exc: APIError) -> EventLogError:
    description = exc.description or ""
    if exc.err_code == WRONG_LAST_SEQUENCE and expect is not None:
        match = _ACTUAL_SEQ.search(description)
        actual = int(match.group(1)) if match else None
        return ConflictError(event.subject, expect, actual, description)
    return AppendError(f"JetStream refused {event.subject}: {description} (code {exc.err_code})")
