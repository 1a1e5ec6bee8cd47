"""Reading ``EVENTS`` over a control-plane connection (an operator's, or a benchmark's).

An ephemeral pull consumer with no acks, filtered to the selected sites, starting at the
selection's sequence or (a little before) its time, read in large batches by
:class:`~lodestream.eventlog.rawpull.RawPull` until the stream's last sequence at the
start: the analysis is of the log as it was when it began, however busy the log is. The
messages come as bytes (no nats-py message, no header parsed): a replay needs only their
sequence, subject and body.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, Final

from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from lodestream.client.analytics.errors import SourceError
from lodestream.client.analytics.intake import Raw
from lodestream.client.analytics.selection import CLOCK_SLACK_S, Selection
from lodestream.eventlog.errors import ReadError
from lodestream.eventlog.jetstream import jetstream
from lodestream.eventlog.rawpull import RawPull
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


async def stream_batches(
    nc: Client, selection: Selection, *, batch: int = BATCH
) -> AsyncIterator[list[Raw]]:
    """The selected messages of ``EVENTS`` up to its last sequence now, in batches."""
    js = jetstream(nc)
    config = consumer_config(selection)
    assert config.name is not None
    try:
        last = int((await js.stream_info(EVENTS_STREAM)).state.last_seq)
        if last == 0 or (selection.since_seq or 1) > last:
            return
        created = await js.add_consumer(EVENTS_STREAM, config)
    except (NatsError, TimeoutError) as exc:
        raise SourceError(f"cannot read the {EVENTS_STREAM} stream: {exc!r}") from exc
    consumer = await RawPull(nc, EVENTS_STREAM, config.name).start()
    try:
        pending = created.num_pending
        while pending:
            raws = []
            try:
                deliveries = await consumer.fetch(batch, FETCH_TIMEOUT_S)
            except ReadError as exc:
                raise SourceError(f"cannot read the {EVENTS_STREAM} stream: {exc}") from exc
            for seq, left, subject, data, _reply in deliveries:
                if seq > last:
                    pending = 0  # past the end this replay was asked for
                    break
                raws.append(Raw(seq, subject, data))
                # What the server still held for this consumer when it sent the message:
                # 0 means every selected message was delivered, and these arrive in order.
                pending = left
            if raws:
                yield raws
    finally:
        await consumer.stop()
        with contextlib.suppress(NotFoundError, NatsError, TimeoutError):
            await js.delete_consumer(EVENTS_STREAM, config.name)
