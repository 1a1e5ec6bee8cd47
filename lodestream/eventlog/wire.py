"""An append as it goes on the wire: subject, NATS headers and payload, encoded once.

The API measures every message against the server's ``max_payload`` before it
appends anything, then publishes it. Encoding an event (and formatting its
headers) once for both keeps the bytes measured and the bytes sent the same
bytes, and halves the cost of a bulk submission's encoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from lodestream.schemas.codec import encode
from lodestream.schemas.envelope import Event
from lodestream.schemas.subjects import EVENTS_STREAM

H_MSG_ID: Final = "Nats-Msg-Id"
H_EXPECTED_STREAM: Final = "Nats-Expected-Stream"
H_EXPECTED_SUBJECT_SEQ: Final = "Nats-Expected-Last-Subject-Sequence"
H_EXPECTED_SUBJECT: Final = "Nats-Expected-Last-Subject-Sequence-Subject"

# NATS headers as nats-py writes them: "NATS/1.0\r\n", "Key: value\r\n" each, then "\r\n".
_HEADER_LINE: Final = "NATS/1.0\r\n"
_CRLF: Final = "\r\n"


def headers_for(event: Event, expect: int | None) -> dict[str, str]:
    headers = {H_MSG_ID: str(event.id), H_EXPECTED_STREAM: EVENTS_STREAM}
    if expect is not None:
        headers[H_EXPECTED_SUBJECT_SEQ] = str(expect)
        headers[H_EXPECTED_SUBJECT] = event.aggregate_subjects
    return headers


def header_block(headers: dict[str, str]) -> bytes:
    """``headers`` as the header block of an ``HPUB``, byte for byte what nats-py sends.

    The values this module writes (ids, sequences, subjects, the stream name) hold no
    whitespace or line breaks, which nats-py would strip or replace.
    """
    lines = "".join(f"{key}: {value}{_CRLF}" for key, value in headers.items())
    return f"{_HEADER_LINE}{lines}{_CRLF}".encode()


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One append, encoded: what :meth:`EventLog.append_batch` publishes."""

    event: Event
    expect: int | None
    subject: str
    headers: bytes  # the HPUB header block (:func:`header_block`)
    payload: bytes  # ``encode(event)``

    @classmethod
    def of(cls, event: Event, expect: int | None) -> Outgoing:
        headers = header_block(headers_for(event, expect))
        return cls(event, expect, event.subject, headers, encode(event))

    @property
    def size(self) -> int:
        """The bytes the server counts against ``max_payload``: headers and payload."""
        return len(self.headers) + len(self.payload)
