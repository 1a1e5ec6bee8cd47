"""``OUTBOX``: the events a leaf-node site keeps while the hub cannot be reached.

It lives in the site's leaf node, in the site's JetStream domain, never on the hub. A
pilot whose append the hub did not answer keeps the event here instead
(:meth:`Outbox.keep`), with the compare-and-set it was made under in a header of ours:
a ``Nats-Expected-*`` header would be checked against this stream's sequences, which
mean nothing to the hub. The site agent's forwarder (``agents/site/forward.py``) takes
the events out in the order they were kept and appends each to the hub's ``EVENTS``
with that compare-and-set: the hub decides, as for every append.

Work-queue retention: an event leaves the stream when the forwarder acknowledges it,
which it does once the hub has taken it, or refused it for good.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from lodestream.eventlog.append import H_MSG_ID
from lodestream.eventlog.errors import AppendError
from lodestream.eventlog.streams import DUPLICATE_WINDOW_S
from lodestream.schemas.codec import encode
from lodestream.schemas.envelope import Event

OUTBOX_STREAM: Final = "OUTBOX"
OUTBOX_PREFIX: Final = "lout"  # lout.<event subject>: never a subject the hub stores
FORWARDER: Final = "forward"
H_EXPECT: Final = "Lode-Expected-Last-Subject-Sequence"


def outbox_subject(event_subject: str) -> str:
    return f"{OUTBOX_PREFIX}.{event_subject}"


def event_subject(outbox: str) -> str:
    prefix = f"{OUTBOX_PREFIX}."
    if not outbox.startswith(prefix):
        raise ValueError(f"not an outbox subject: {outbox!r}")
    return outbox[len(prefix) :]


def outbox_config(site: str) -> StreamConfig:
    return StreamConfig(
        name=OUTBOX_STREAM,
        description=f"lodestream: events of site {site} kept while the hub was unreachable",
        subjects=[f"{OUTBOX_PREFIX}.evt.{site}.>"],
        retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE,
        max_age=0,
        duplicate_window=DUPLICATE_WINDOW_S,
    )


def forwarder_config() -> ConsumerConfig:
    # One event at a time: the next is not handed out before the last was acked, so the
    # events reach the hub in the order they were kept, whoever runs the forwarder.
    return ConsumerConfig(
        durable_name=FORWARDER, ack_policy=AckPolicy.EXPLICIT, max_ack_pending=1, ack_wait=30.0
    )


async def ensure_outbox(local: JetStreamContext, site: str) -> None:
    """Create ``OUTBOX`` and its forwarder's consumer in the leaf's domain (idempotent)."""
    config = outbox_config(site)
    try:
        await local.add_stream(config)
    except Exception:  # exists already (maybe with an older config): bring it up to date
        await local.update_stream(config)
    await local.add_consumer(OUTBOX_STREAM, forwarder_config())


def expected(headers: dict[str, str] | None) -> int | None:
    """The compare-and-set an outboxed event was made under (None: none)."""
    value = (headers or {}).get(H_EXPECT)
    return int(value) if value is not None else None


@dataclass(frozen=True, slots=True)
class Outbox:
    """What a site process keeps at the site: the leaf's own JetStream (no domain prefix)."""

    local: JetStreamContext
    timeout_s: float = 5.0

    async def keep(self, event: Event, expect: int | None) -> int:
        """Store ``event`` in the leaf; its sequence there. Raises :class:`AppendError`."""
        headers = {H_MSG_ID: str(event.id)}
        if expect is not None:
            headers[H_EXPECT] = str(expect)
        try:
            ack = await self.local.publish(
                outbox_subject(event.subject),
                encode(event),
                timeout=self.timeout_s,
                stream=OUTBOX_STREAM,
                headers=headers,
            )
        except Exception as exc:
            raise AppendError(f"the leaf did not keep {event.subject}: {exc!r}") from exc
        return ack.seq
