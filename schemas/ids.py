"""Identifiers: time-ordered UUIDv7 for new facts, name-based UUIDs for facts that must repeat.

Python 3.11 has no ``uuid.uuid7``; this is RFC 9562 §5.7 with the 12-bit
``rand_a`` used as a sub-millisecond counter so ids minted in one process are
strictly increasing (which keeps B-tree inserts append-only).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import threading
import time
import uuid
from typing import Final

_lock = threading.Lock()
_last_ms = 0
_counter = 0

# Namespace for ids derived from a cause (idempotent submissions, controller consequences).
LODESTREAM_NAMESPACE = uuid.UUID("6f6c6f64-6573-7472-6561-6d0000000001")


SHORT_ID_DIGITS: Final = 8
MIN_ID_PART: Final = 4
_HEX: Final = re.compile(r"[0-9a-f]{%d,32}" % MIN_ID_PART)  # noqa: UP031 - a regex's braces


def short_id(job_id: uuid.UUID | str) -> str:
    """The last eight hex digits of an id, the part a person reads.

    A UUIDv7 begins with its creation time, so ids minted in the same minute share their
    first eight digits; its last digits are random and tell them apart.
    """
    return str(job_id).replace("-", "")[-SHORT_ID_DIGITS:]


def id_part(text: str) -> str | None:
    """``text`` as lowercase hex digits without hyphens, if it may be a prefix or suffix of
    an id (at least :data:`MIN_ID_PART` digits); None otherwise."""
    digits = text.strip().lower().replace("-", "")
    return digits if _HEX.fullmatch(digits) else None


def uuid7() -> uuid.UUID:
    """Return a new UUIDv7, monotonic within this process."""
    with _lock:
        now_ms, rand_a = _next_stamp()
    rand_b = int.from_bytes(os.urandom(8), "big") & _RAND_B_MASK
    return uuid.UUID(int=_compose(now_ms, rand_a, rand_b))


def uuid7s(count: int) -> list[uuid.UUID]:
    """``count`` new UUIDv7s, as ``count`` calls of :func:`uuid7` would return them.

    For a bulk submission's ids (two per job): one lock and one read of the random
    source for all of them instead of one each.
    """
    with _lock:
        stamps = [_next_stamp() for _ in range(count)]
    random = os.urandom(8 * count)
    rand_bs = (
        int.from_bytes(random[i : i + 8], "big") & _RAND_B_MASK for i in range(0, 8 * count, 8)
    )
    return [
        uuid.UUID(int=_compose(now_ms, rand_a, rand_b))
        for (now_ms, rand_a), rand_b in zip(stamps, rand_bs, strict=True)
    ]


_RAND_B_MASK = 0x3FFF_FFFF_FFFF_FFFF


def _next_stamp() -> tuple[int, int]:
    """The millisecond and sub-millisecond counter of the next id; called under ``_lock``."""
    global _last_ms, _counter  # noqa: PLW0603 - process-wide monotonic clock state
    now_ms = time.time_ns() // 1_000_000
    if now_ms <= _last_ms:
        _counter += 1
        if _counter > 0xFFF:  # counter exhausted: borrow the next millisecond
            _last_ms += 1
            _counter = 0
        now_ms = _last_ms
    else:
        _last_ms = now_ms
        _counter = 0
    return now_ms, _counter


def _compose(now_ms: int, rand_a: int, rand_b: int) -> int:
    value = (now_ms & 0xFFFF_FFFF_FFFF) << 80
    value |= 0x7 << 76
    value |= rand_a << 64
    value |= 0b10 << 62
    value |= rand_b
    return value


def derived_id(*parts: str) -> uuid.UUID:
    """A stable id for a fact that is defined by its cause, so a retry mints the same id."""
    # Length-prefixed so ("a/b", "c") and ("a", "b/c") can never collide.
    return uuid.uuid5(LODESTREAM_NAMESPACE, "".join(f"{len(p)}:{p}" for p in parts))


def keyed_id(secret: bytes, *parts: str) -> uuid.UUID:
    """A stable id that only the holders of ``secret`` can compute (a UUIDv8).

    For ids whose inputs an outsider can guess (a user's name and a client's idempotency
    key): JetStream de-duplicates ``Nats-Msg-Id`` across the whole stream, so a site that
    could compute the id of a user's next submission could publish it first, on its own
    subject, and have the submission dropped as a duplicate. Without a secret this is
    :func:`derived_id`.
    """
    if not secret:
        return derived_id(*parts)
    message = "".join(f"{len(p)}:{p}" for p in parts).encode()
    digest = bytearray(hmac.new(secret, message, hashlib.sha256).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x80  # version 8: custom
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 9562 variant
    return uuid.UUID(bytes=bytes(digest))
