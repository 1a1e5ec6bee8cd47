"""Property: no message stops a consumer. Arbitrary subjects, bytes and headers, fed to the
entry point of every consumer, end as a checked value or a refusal, never as a crash.

The inputs mix pure noise with near misses that get further into the code: valid events
on the wrong subject, valid JSON with one field changed, heartbeat subjects with malformed
sessions, and the headers the server itself uses (``Nats-Marker-Reason``,
``Nats-Stream-Source``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from lodestream.agents.launcher.work import NotWork, work_item
from lodestream.schemas.codec import encode
from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import Untrusted
from lodestream.schemas.events.session import Heartbeat
from lodestream.schemas.subjects import EVENTS_STREAM, HB_STREAM
from lodestream.schemas.trust import (
    MARKER_HEADER,
    SOURCE_HEADER,
    HeartbeatExpired,
    check_event,
    event_from_message,
    heartbeat_message,
)
from lodestream.services.controller.loop import Controller
from lodestream.services.projector.messages import RawMessage, decode_message
from lodestream.services.projector.rows import QuarantineRow
from tests.support.builders import job_created, lifecycle

SESSION = uuid.UUID("00000000-0000-7000-8000-000000000001")
VALID = [job_created("alpha", "ada"), *lifecycle(job_created("alpha", "ada"), SESSION)]


@dataclass
class Metadata:
    @dataclass
    class Sequence:
        stream: int = 7
        consumer: int = 7

    sequence: Sequence = field(default_factory=Sequence)
    num_delivered: int = 1


@dataclass
class Msg:
    """A stand-in for a nats-py message (subject, data, headers, metadata): what arrives."""

    subject: str
    data: bytes
    headers: dict[str, str] | None
    metadata: Metadata = field(default_factory=Metadata)


def _subjects_for(event: Event) -> st.SearchStrategy[str]:
    return st.sampled_from(
        [
            event.subject,
            event.subject.replace("alpha", "beta", 1),
            event.subject.rsplit(".", 1)[0] + ".created",
            f"evt.alpha.job.{uuid.uuid4()}.{event.type.partition('.')[2]}",
            "evt.alpha.job.*.started",
            "evt..job..",
        ]
    )


@st.composite
def near_events(draw: st.DrawFn) -> tuple[str, bytes]:
    event = draw(st.sampled_from(VALID))
    document = orjson.loads(encode(event))
    if draw(st.booleans()):
        key = draw(st.sampled_from(sorted(document)))
        document[key] = draw(st.none() | st.integers() | st.text() | st.lists(st.integers()))
    if draw(st.booleans()) and isinstance(document.get("data"), dict):
        document["data"][draw(st.text(max_size=8))] = draw(st.text() | st.integers())
    # json, not orjson: a hostile writer is not bound to 64-bit integers.
    return draw(_subjects_for(event) | st.text()), json.dumps(document).encode()


@st.composite
def heartbeats(draw: st.DrawFn) -> tuple[str, bytes]:
    session = draw(st.sampled_from([str(SESSION), "not-a-uuid", "", "*", str(uuid.uuid4())]))
    site = draw(st.sampled_from(["alpha", "beta", "Alpha", "", ">"]))
    body = Heartbeat(session_id=SESSION, site="alpha", at=datetime.now(UTC))
    data = draw(st.sampled_from([orjson.dumps(body.model_dump(mode="json")), b"", b"{}"]))
    return f"hb.{site}.{session}", data if draw(st.booleans()) else draw(st.binary())


HEADERS = st.none() | st.dictionaries(
    st.sampled_from([MARKER_HEADER, SOURCE_HEADER, "Nats-Rollup", "Nats-TTL", "X"]) | st.text(),
    st.text(),
    max_size=3,
)
MESSAGES = st.tuples(near_events() | heartbeats() | st.tuples(st.text(), st.binary()), HEADERS).map(
    lambda pair: Msg(pair[0][0], pair[0][1], pair[1])
)


@settings(max_examples=400, deadline=None)
@given(MESSAGES)
def test_the_shared_rule_checks_or_refuses(msg: Msg) -> None:
    try:
        event = event_from_message(msg.subject, msg.data)
    except Untrusted:
        pass
    else:
        assert check_event(msg.subject, event) is event  # what passed once passes again
        assert event.subject == msg.subject
    with contextlib.suppress(Untrusted):
        heartbeat_message(msg.subject, msg.headers, msg.data)


@settings(max_examples=400, deadline=None)
@given(MESSAGES, st.sampled_from([EVENTS_STREAM, HB_STREAM]))
def test_the_projector_decodes_or_quarantines(msg: Msg, stream: str) -> None:
    raw = RawMessage(stream, 7, msg.subject, msg.data, msg.headers)
    decoded = decode_message(raw)
    if isinstance(decoded, QuarantineRow):
        assert decoded.reason
        assert "\x00" not in decoded.reason + decoded.subject  # storable as text


@settings(max_examples=300, deadline=None)
@given(st.lists(MESSAGES, min_size=1, max_size=5))
def test_the_controller_refuses_what_it_cannot_trust(msgs: list[Msg]) -> None:
    controller = Controller(None, "")  # type: ignore[arg-type]  # decoding needs no I/O
    expired: list[HeartbeatExpired] = []

    async def record_expiry(site: str, session_id: uuid.UUID, marker_seq: int) -> None:
        # Stand-in for the fencing round trip (read model + appends), tested for real in
        # tests/integration/test_controller.py; here only what reaches it matters.
        expired.append(HeartbeatExpired(site, session_id))

    controller._expire = record_expiry  # type: ignore[method-assign]
    decoded = controller._decoded(msgs)
    assert len(decoded) + controller.refused == len(msgs)
    asyncio.run(controller._on_heartbeats(msgs))
    for expiry in expired:  # only a marker the server wrote counts as an expiry
        assert any(
            m.headers and MARKER_HEADER in m.headers and SOURCE_HEADER not in m.headers
            for m in msgs
        ), expiry


@settings(max_examples=300, deadline=None)
@given(MESSAGES)
def test_the_pilot_takes_work_or_skips_it(msg: Msg) -> None:
    try:
        item = work_item(msg, "alpha")
    except NotWork:
        return
    assert item.site == item.spec.site == "alpha"
    assert msg.subject.startswith("evt.alpha.job.")
