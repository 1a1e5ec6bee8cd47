"""The stream sequences of events the api pushes (``/events/stream``), as a plain iterator.

What ``lode events --follow`` waits on instead of polling: each sequence says "an event of
yours is on the log up to here". The feed is resumed from the last id seen after a
``lagged`` or ``interrupted`` notice or a dropped connection, as a browser's EventSource
would; an api that cannot push (no feed route, or its feed is unavailable) ends the
iterator with :class:`PushUnavailable`, and the caller goes back to polling.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Final

import httpx

RECONNECT_S: Final = 1.0
READ_TIMEOUT_S: Final = 60.0  # the feed sends a keepalive well within this


class PushUnavailable(Exception):
    """The api does not push events to this client; poll instead."""


def pushed_sequences(
    http: httpx.Client, after_seq: int, params: Mapping[str, str]
) -> Iterator[int]:
    """Sequences of pushed events after ``after_seq``, forever; break out to stop."""
    last = after_seq
    timeout = httpx.Timeout(10.0, read=READ_TIMEOUT_S)
    while True:
        headers = {"Last-Event-ID": str(last)}
        try:
            with http.stream(
                "GET", "/events/stream", params=params, headers=headers, timeout=timeout
            ) as response:
                if response.status_code != 200:
                    raise PushUnavailable(f"the api answered {response.status_code}")
                for seq in _event_ids(response.iter_lines()):
                    last = max(last, seq)
                    yield seq
        except httpx.TransportError:
            pass  # a dropped connection: resume from the last id, as EventSource does
        time.sleep(RECONNECT_S)


def _event_ids(lines: Iterator[str]) -> Iterator[int]:
    """The id of each event frame (not of keepalives or notices), as frames complete."""
    seq: int | None = None
    is_event = False
    for line in lines:
        if line.startswith("id: "):
            seq = int(line[4:])
        elif line.startswith("data: "):
            is_event = True
        elif line.startswith("event: "):
            is_event = False
            seq = None  # a notice (lagged, interrupted): the feed ends after it
        elif not line:
            if seq is not None and is_event:
                yield seq
            seq, is_event = None, False
