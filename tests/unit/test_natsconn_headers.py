"""lodestream's NATS client parses message headers as nats-py does, only faster
(``lodestream/natsconn.py``): the same dict for any header block, well-formed or not."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from nats.aio.client import Client

from lodestream.natsconn import TolerantClient

NAMES = st.sampled_from(
    [b"Nats-Msg-Id", b"Nats-Expected-Stream", b"Status", b"X y", b"X\tY", b"\xffbad",
     b" Padded ", b"A\x0bB", b"A\x1cB", b"", b"Nats-Expected-Last-Subject-Sequence-Subject"]
)  # fmt: skip
LINES = st.one_of(
    st.builds(lambda n, v: n + b":" + v, NAMES, st.binary(max_size=20)),
    st.builds(lambda n, v: n + b": " + v, NAMES, st.text(max_size=20).map(str.encode)),
    st.binary(max_size=30),
)


@given(st.lists(LINES, max_size=8))
def test_headers_parse_as_nats_py_parses_them(lines: list[bytes]) -> None:
    raw = b"\r\n".join(lines) + b"\r\n\r\n"
    assert TolerantClient._parse_header_lines(raw) == Client._parse_header_lines(raw)


@given(st.binary(max_size=200))
def test_any_bytes_parse_as_nats_py_parses_them(raw: bytes) -> None:
    assert TolerantClient._parse_header_lines(raw) == Client._parse_header_lines(raw)


def test_the_headers_of_a_stored_event() -> None:
    raw = (
        b"Nats-Msg-Id: 01900000-0000-7000-8000-000000000001\r\n"
        b"Nats-Expected-Stream: EVENTS\r\n"
        b"Nats-Expected-Last-Subject-Sequence: 12\r\n"
        b"Nats-Expected-Last-Subject-Sequence-Subject: evt.alpha.job.x.>\r\n\r\n"
    )
    parsed = TolerantClient._parse_header_lines(raw)
    assert parsed == Client._parse_header_lines(raw)
    assert parsed["Nats-Expected-Last-Subject-Sequence"] == "12"
