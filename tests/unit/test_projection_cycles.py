"""The projector's decode and fold make no reference cycles, so a rebuild may pause the
cyclic collector (``services/projector/rebuild.py``, :mod:`lodestream.collector`).

Were a cycle made there, a rebuild would keep it in memory until its end, once per event.
Here a log's worth of messages of both streams, with the refusals of the shared rule,
illegal transitions and a forged heartbeat among them, is decoded and folded with the
collector off, and the collector then finds nothing.
"""

from __future__ import annotations

import gc
import uuid

from lodestream.schemas.codec import encode
from lodestream.schemas.envelope import Event
from lodestream.schemas.events import JobReady, JobStarted
from lodestream.schemas.events.job import StartedData
from lodestream.schemas.events.session import Heartbeat
from lodestream.schemas.subjects import EVENTS_STREAM, HB_STREAM, heartbeat_subject
from lodestream.schemas.trust import MARKER_HEADER
from lodestream.services.projector.messages import RawMessage, decode_message
from lodestream.services.projector.projection import Changes, Known, Projection
from tests.support.builders import job_created, lifecycle, site_registered
from tests.support.folding import AT, OWNER, SESSION, SITE


def event_messages() -> list[RawMessage]:
    events: list[Event] = [site_registered(SITE, OWNER)]
    for _ in range(20):
        created = job_created(SITE, OWNER)
        events += [created, *lifecycle(created)]
    job = uuid.uuid4()
    # Illegal: a job nobody created, started without a lease.
    events += [
        JobReady.create(site=SITE, aggregate_id=job, actor="controller:main"),
        JobStarted.create(site=SITE, aggregate_id=job, actor="launcher:x",
                          data=StartedData(session_id=uuid.uuid4())),
    ]  # fmt: skip
    raws = [RawMessage(EVENTS_STREAM, seq, e.subject, encode(e)) for seq, e in enumerate(events, 1)]
    forged = events[1]  # a job of alpha on beta's subject
    return [
        *raws,
        RawMessage(EVENTS_STREAM, len(raws) + 1, f"evt.{SITE}.job.{job}.finished", b"{oops"),
        RawMessage(EVENTS_STREAM, len(raws) + 2, forged.subject.replace(SITE, "beta", 1),
                   encode(forged)),
    ]  # fmt: skip


def heartbeat_messages() -> list[RawMessage]:
    subject = heartbeat_subject(SITE, SESSION)
    beat = Heartbeat(session_id=SESSION, site=SITE, at=AT).model_dump_json().encode()
    return [
        RawMessage(HB_STREAM, 1, subject, beat),
        RawMessage(HB_STREAM, 2, subject, b"not a heartbeat"),
        RawMessage(HB_STREAM, 3, subject, b"", {MARKER_HEADER: "MaxAge"}),
    ]


def test_decoding_and_folding_both_streams_leaves_nothing_to_collect(collector: None) -> None:
    raws = event_messages() + heartbeat_messages()
    gc.collect()
    gc.disable()
    projection = Projection(Known(), Changes())
    for raw in raws:
        projection.fold(raw, decode_message(raw))
    reasons = [q.reason for q in projection.changes.quarantine]
    assert len(projection.changes.new_jobs) == 20
    assert len(projection.changes.job_events) == 100
    assert len(reasons) == 5, reasons
    assert gc.collect() == 0
