"""Durations and timestamps as schedulers print them, read into seconds and tz-aware UTC."""

from __future__ import annotations

import time
from datetime import UTC, datetime, tzinfo
from typing import Final

# What schedulers print for "no such time" / "no limit".
NO_VALUE: Final = frozenset({
    "", "-", "N/A", "NONE", "UNKNOWN", "UNLIMITED", "INFINITE", "NOT_SET", "PARTITION_LIMIT",
    "INVALID", "(NULL)",
})  # fmt: skip


def duration_s(text: str) -> int | None:
    """Seconds in a duration such as ``1-02:03:04``, ``02:03:04``, ``03:04`` or ``30``.

    Slurm's reading: ``[days-]hours:minutes:seconds``, ``minutes:seconds``, a lone number is
    minutes, and after ``days-`` the first field is hours. None for no value or no limit; a
    malformed duration raises ``ValueError``.
    """
    text = text.strip()
    if text.upper() in NO_VALUE:
        return None
    days = 0
    if "-" in text:
        day_text, text = text.split("-", 1)
        days = _natural(day_text)
        hours, minutes, seconds = (_natural(p) for p in [*text.split(":"), "0", "0"][:3])
        if text.count(":") > 2:
            raise ValueError(f"malformed duration {text!r}")
    else:
        parts = [_natural(p) for p in text.split(":")]
        if len(parts) == 1:
            hours, minutes, seconds = 0, parts[0], 0
        elif len(parts) == 2:
            hours, (minutes, seconds) = 0, parts
        elif len(parts) == 3:
            hours, minutes, seconds = parts
        else:
            raise ValueError(f"malformed duration {text!r}")
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def _natural(text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"not a whole number: {text!r}")
    return int(text)


def minutes_of(seconds: int | None) -> int | None:
    """Whole minutes, rounded down (a window of 59 s is no 1-minute window)."""
    return None if seconds is None else seconds // 60


def localize(naive: datetime, tz: tzinfo | None) -> datetime:
    """A wall-clock time printed in ``tz`` (None: this host's zone, DST included) as UTC."""
    if tz is not None:
        return naive.replace(tzinfo=tz).astimezone(UTC)
    # mktime applies the host's zone rules for that date, so DST is right on both sides.
    return datetime.fromtimestamp(time.mktime(naive.timetuple()), tz=UTC).replace(
        microsecond=naive.microsecond
    )


def parse_local(text: str, fmt: str, tz: tzinfo | None) -> datetime | None:
    """A local wall-clock time in ``fmt`` as UTC; None for the no-value words. ``ValueError``
    if it is something else."""
    text = text.strip()
    if text.upper() in NO_VALUE:
        return None
    naive = datetime.strptime(text, fmt)  # noqa: DTZ007  (localized on the next line)
    return localize(naive, tz)


def parse_local_iso(text: str, tz: tzinfo | None) -> datetime | None:
    """Slurm's ``2024-03-01T10:00:00`` (its local time), as UTC."""
    return parse_local(text, "%Y-%m-%dT%H:%M:%S", tz)


def from_epoch(value: float | None) -> datetime | None:
    """Seconds since the epoch as UTC; 0 and None (Slurm's and Flux's "not yet") are None."""
    if not value:
        return None
    return datetime.fromtimestamp(value, tz=UTC)


def seconds_between(start: datetime | None, end: datetime) -> int | None:
    if start is None:
        return None
    return max(0, int((end - start).total_seconds()))
