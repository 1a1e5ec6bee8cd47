"""Reading ``EVENTS`` over a control-plane connection (an operator's, or a benchmark's).

An ephemeral pull consumer with no acks, filtered to the selected sites, starting at the
selection's sequence or (a little before) its time, read in large batches by
:class:`~lodestream.eventlog.rawpull.RawPull` until the stream's last sequence at the
start: the analysis is of the log as it was when it began, however busy the log is. The
messages come as bytes (no nats-py message, no header parsed): a replay needs only their
sequence, subject and body. A replay split across processes takes that last sequence once
(:func:`stream_span`) and reads the range once, as the wire gave it (:func:`range_wires`),
handing each process its share to parse (:func:`raws_of`).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple

from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from lodestream.client.analytics.errors import SourceError
from lodestream.client.analytics.intake import Raw
from lodestream.client.analytics.selection import CLOCK_SLACK_S, Selection
from lodestream.eventlog.errors import ReadError
from lodestream.eventlog.jetstream import jetstream
from lodestream.eventlog.rawpull import RawPull, Wire, delivery_of
from lodestream.schemas.subjects import EVENTS_STREAM

BATCH: Final = 10_000
FETCH_TIMEOUT_S: Final = 2.0


def consumer_config(selection: Selection) -> ConsumerConfig:
    """Where and what the replay's consumer delivers."""
    start: dict[str, Any] = {"deliver_policy": DeliverPolicy.ALL}
    if selection.since_seq is not None:
        start = {"deliver_policy": DeliverPolicy.BY_START_SEQUENCE,
                 "opt_start_seq": selection.since_seq}  # fmt: skip
    elif selection.since is not None:
        moment = datetime.fromtimestamp(selection.since - CLOCK_SLACK_S, UTC)
        start = {"deliver_policy": DeliverPolicy.BY_START_TIME, "opt_start_time": moment}
    sites = sorted(selection.sites)
    return ConsumerConfig(
        name=f"analytics-{uuid.uuid4().hex[:12]}",
        description="lode analytics: one replay of the log",
        ack_policy=AckPolicy.NONE,
        filter_subjects=[f"evt.{site}.>" for site in sites] or None,
        inactive_threshold=30.0,
        max_waiting=2,  # the reader asks for the next batch while it works on one
        mem_storage=True,
        num_replicas=1,
        **start,
    )


class Span(NamedTuple):
    """The sequences a replay will read: from ``first`` to ``last`` (a site filter or a start
    time may leave some of them out)."""

    first: int
    last: int

    @property
    def messages(self) -> int:
        return self.last - self.first + 1


async def stream_batches(
    nc: Client, selection: Selection, *, batch: int = BATCH
) -> AsyncIterator[list[Raw]]:
    """The selected messages of ``EVENTS`` up to its last sequence now, in batches."""
    span = await stream_span(nc, selection)
    if span is not None:
        async for raws in range_batches(nc, selection, span.last, batch=batch):
            yield raws


async def stream_span(nc: Client, selection: Selection) -> Span | None:
    """Where the selection starts in ``EVENTS`` and the stream's last sequence now; None if
    it starts past the end (or the stream is empty): nothing to read."""
    try:
        state = (await jetstream(nc).stream_info(EVENTS_STREAM)).state
    except (NatsError, TimeoutError) as exc:
        raise SourceError(f"cannot read the {EVENTS_STREAM} stream: {exc!r}") from exc
    first, last = max(int(state.first_seq), selection.since_seq or 1), int(state.last_seq)
    if last == 0 or first > last:
        return None
    return Span(first, last)


async def range_batches(
    nc: Client,
    selection: Selection,
    last: int,
    *,
    batch: int = BATCH,
) -> AsyncIterator[list[Raw]]:
    """The selected messages of ``EVENTS`` up to sequence ``last``, in batches."""
    async for wires in range_wires(nc, selection, last, batch=batch):
        raws = raws_of(wires, last)
        if raws:
            yield raws


def raws_of(wires: Iterable[Wire], last: int) -> list[Raw]:
    """The messages of ``wires`` (as :func:`range_wires` gave them) up to sequence ``last``."""
    return [Raw(d.seq, d.subject, d.data) for d in map(delivery_of, wires) if d.seq <= last]


async def range_wires(
    nc: Client,
    selection: Selection,
    last: int,
    *,
    batch: int = BATCH,
) -> AsyncIterator[list[Wire]]:
    """The selected messages of ``EVENTS`` as they came off the wire, nothing of them parsed,
    until sequence ``last`` (the last batch may hold some past it: :func:`raws_of` drops
    them)."""
    js = jetstream(nc)
    config = consumer_config(selection)
    assert config.name is not None
    try:
        created = await js.add_consumer(EVENTS_STREAM, config)
    except (NatsError, TimeoutError) as exc:
        raise SourceError(f"cannot read the {EVENTS_STREAM} stream: {exc!r}") from exc
    consumer = await RawPull(nc, EVENTS_STREAM, config.name).start()
    try:
        try:
            async for wires in consumer.wires_until(
                last, created.num_pending or 0, batch=batch, fetch_timeout_s=FETCH_TIMEOUT_S
            ):
                yield wires
        except (ReadError, NatsError) as exc:
            raise SourceError(f"cannot read the {EVENTS_STREAM} stream: {exc}") from exc
    finally:
        await consumer.stop()
        with contextlib.suppress(NotFoundError, NatsError, TimeoutError):
            await js.delete_consumer(EVENTS_STREAM, config.name)
