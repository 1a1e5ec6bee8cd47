"""``decode_as`` (the subject's class, on the bytes) accepts and refuses what ``decode`` does.

``decode`` is the rule (orjson, the NUL walk, the version checks, upcasting); ``decode_as``
is what every consumer runs on every hop. For every event type, every field of a valid
event is replaced by each of a table of hostile JSON tokens (and by random JSON values),
and the two must agree: both refuse with the same reason, or both return the same event.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lodestream.schemas import codec
from lodestream.schemas.codec import decode, decode_as, encode, to_document
from lodestream.schemas.errors import DecodeError, Untrusted
from lodestream.schemas.trust import event_from_message
from lodestream.schemas.upcast import unregister, upcaster
from tests.unit.test_schemas import AGGREGATE, EVENT_TYPES, SITE, sample_event

Verdict = tuple[str, Any]
Path = tuple[str | int, ...]

PLACEHOLDER = "__hostile__"
HOSTILE_TOKENS: tuple[bytes, ...] = (
    *(b"null", b"true", b"false", b"0", b"-0", b"-1", b"1", b"2", b"1.0", b"1.5", b"1e2"),
    *(b"2147483648", b"-2147483649", b"9223372036854775807", b"9223372036854775808"),
    *(b"18446744073709551616", b"123456789012345678901234567890", b"-9223372036854775809"),
    *(b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400", b"1e-400"),
    *(b'""', b'"x"', b'"1"', b'"true"', b'" alpha"', b'"ALPHA"', b'"a.b"', b'"a*"'),
    *(b'"\\u0000"', b'"a\\u0000b"', b'"\\\\u0000"', b'"\\ud800"', b'"\\ud83d\\ude00"'),
    *(b'"\\u0085"', b'"a\\nb"', b'"/abs"', b'"../up"', b'"./"', b'"."'),
    *(b'"2025-01-02T03:04:05"', b'"2025-01-02T03:04:05Z"', b'"2025-01-02"', b'"1735787045"'),
    *(b'"01900000-0000-7000-8000-000000000001"', b'"01900000000070008000000000000001"'),
    *(b'"controller:x"', b'"site:alpha"', b'"launcher:x"', b'"job.failed"'),
    *(b"[]", b"[1]", b'["x"]', b"{}", b'{"a": 1}', b'{"\\u0000": 1}', b"[null]"),
)
"""Values in the shape of every field type, and the edges where JSON parsers differ."""


def verdict_of(call: Any, *args: Any) -> Verdict:
    try:
        event = call(*args)
    except DecodeError as exc:
        return ("refused", str(exc))
    return ("accepted", (type(event), event, encode(event)))


def assert_agree(event_type: str, raw: bytes) -> Verdict:
    expected = verdict_of(decode, raw)
    assert verdict_of(decode_as, event_type, raw) == expected, raw
    return expected


def leaf_paths(value: Any, path: Path = ()) -> Iterator[Path]:
    """Every place in a JSON document a value can be put: each key, item and container."""
    if path:
        yield path
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from leaf_paths(inner, (*path, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from leaf_paths(inner, (*path, index))


def replaced(document: Any, path: Path, new: Any) -> Any:
    if not path:
        return new
    head, *rest = path
    if isinstance(document, dict):
        return {**document, head: replaced(document[head], tuple(rest), new)}
    copy = list(document)
    copy[int(head)] = replaced(copy[int(head)], tuple(rest), new)
    return copy


def with_token(document: Any, path: Path, token: bytes) -> bytes:
    raw = orjson.dumps(replaced(document, path, PLACEHOLDER))
    return raw.replace(orjson.dumps(PLACEHOLDER), token)


def test_every_type_takes_the_fast_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the writers encode is decoded without the general path's second parse."""

    def general(raw: bytes | str) -> None:
        raise AssertionError(f"fell back to decode() for {raw!r}")

    monkeypatch.setattr(codec, "decode", general)
    for event_type in EVENT_TYPES:
        event = sample_event(event_type)
        assert decode_as(event_type, encode(event)) == event


@pytest.mark.parametrize("event_type", EVENT_TYPES)
def test_hostile_values_in_every_field(event_type: str) -> None:
    document = to_document(sample_event(event_type))
    refused = 0
    for path in leaf_paths(document):
        for token in HOSTILE_TOKENS:
            refused += assert_agree(event_type, with_token(document, path, token))[0] == "refused"
    assert refused > 0  # the table reaches the checks, not only the happy path


@pytest.mark.parametrize("event_type", EVENT_TYPES)
def test_missing_unknown_and_hostile_keys(event_type: str) -> None:
    document = to_document(sample_event(event_type))
    for path in leaf_paths(document):
        *parents, last = path
        parent: Any = document
        for step in parents:
            parent = parent[step]
        if not isinstance(parent, dict):
            continue
        without = {k: v for k, v in parent.items() if k != last}
        for variant in (without, {**parent, "extra": 1}, {**without, f"{last}\u0000": 1}):
            assert_agree(event_type, orjson.dumps(replaced(document, tuple(parents), variant)))


@pytest.mark.parametrize(
    "mutate",
    [
        lambda raw: b"\xef\xbb\xbf" + raw,  # BOM
        lambda raw: b" \t\n" + raw + b"\r\n ",
        lambda raw: raw + b" x",
        lambda raw: raw + raw,
        lambda raw: raw[:-1],
        lambda raw: raw.replace(b'"site":', b'"site":"alpha","site":', 1),  # duplicate key
        lambda raw: raw.replace(b'"v":', b'"v":7,"v":', 1),
        lambda raw: raw.replace(b'"actor":', b'"\\u0061ctor":', 1),  # escaped key
        lambda raw: raw.replace(b'"site":"alpha"', b'"site":"alph\\u0061"', 1),
        lambda raw: raw.replace(b'"site":"alpha"', b'"site":"alpha\x00"', 1),  # raw control byte
        lambda raw: raw.replace(b'"site":"alpha"', b'"site":"alpha\xff"', 1),  # not UTF-8
        lambda raw: raw.replace(b'"site":"alpha"', b'"site":"alpha\xed\xa0\x80"', 1),
        lambda raw: raw.replace(b"{", b"[", 1),
        lambda raw: b"",
        lambda raw: b"null",
        lambda raw: b"[]",
        lambda raw: b'"job.failed"',
    ],
)
@pytest.mark.parametrize("event_type", ["job.created", "job.run_done", "job.failed"])
def test_malformed_bytes(event_type: str, mutate: Any) -> None:
    assert_agree(event_type, mutate(encode(sample_event(event_type))))


def test_every_truncation() -> None:
    raw = encode(sample_event("job.started"))
    for end in range(len(raw)):
        assert assert_agree("job.started", raw[:end])[0] == "refused"


JSON_VALUES = st.recursive(
    # Integers as far as orjson writes them; the parsers' edges beyond are in the table above.
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(event_type=st.sampled_from(EVENT_TYPES), data=st.data())
def test_random_values_anywhere(event_type: str, data: st.DataObject) -> None:
    document = to_document(sample_event(event_type))
    path = data.draw(st.sampled_from([(), *leaf_paths(document)]))
    value = data.draw(JSON_VALUES)
    assert_agree(event_type, orjson.dumps(replaced(document, path, value)))


def test_a_payload_of_another_type_is_refused_with_its_reason() -> None:
    event = sample_event("job.failed")
    subject = event.subject.replace(".failed", ".killed")
    assert decode_as("job.killed", encode(event)) == event  # it is what it says it is …
    with pytest.raises(Untrusted, match=r"event type job\.failed on a subject for job\.killed"):
        event_from_message(subject, encode(event))  # … and not what the subject says


def test_an_unknown_subject_type_takes_the_general_path() -> None:
    raw = encode(sample_event("job.failed"))
    assert assert_agree("job.exploded", raw)[0] == "accepted"
    with pytest.raises(Untrusted, match="not an event subject"):
        event_from_message("evt.alpha.job", raw)


def test_old_versions_are_upcast_on_the_subject_path() -> None:
    for event_type in ("job.finished", "job.restart_ready"):  # both have a v1 on the log
        document = to_document(sample_event(event_type))
        v1 = orjson.dumps({**document, "v": 1})
        accepted = assert_agree(event_type, v1)
        assert accepted[0] == "accepted"
        assert accepted[1][1].v == 2


def test_a_registered_upcaster_runs_on_the_subject_path() -> None:
    @upcaster("job.killed", 0)
    def _v0(document: dict[str, Any]) -> dict[str, Any]:
        why = document.pop("why")
        return {**document, "data": {"reason": why}}

    try:
        old = {**to_document(sample_event("job.killed")), "v": 0, "why": "user"}
        del old["data"]
        subject = f"evt.{SITE}.job.{AGGREGATE}.killed"
        event = event_from_message(subject, orjson.dumps(old))
        assert event.data.reason == "user"  # type: ignore[attr-defined]
        assert event.v == 1
    finally:
        unregister("job.killed", 0)


def test_escaped_backslash_before_u0000_is_no_nul() -> None:
    event = sample_event("job.failed")
    raw = encode(event).replace(b'"parent failed"', b'"parent \\\\u0000 failed"')
    accepted = assert_agree("job.failed", raw)
    assert accepted[0] == "accepted"
    assert accepted[1][1].data.reason == "parent \\u0000 failed"


def test_random_ids_round_trip() -> None:
    for _ in range(50):
        event = sample_event("job.leased", aggregate_id=uuid.uuid4(), actor="launcher:pilot")
        assert event_from_message(event.subject, encode(event)) == event
