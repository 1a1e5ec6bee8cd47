"""The pilot's own timestamps of a run, where its events carry them.

Pilots are gaining per-step stamps (RADICAL-Pilot style): when the lease was acknowledged
(``leased_at``), when the process was being spawned (``spawned_at``), when it was seen to
exit (``exited_at``), and its ``pid``. They travel in ``job.started`` and in the run's
result event, either flat in ``data`` or under ``data.profile`` (a ``job.finished`` that
stands for the run carries them in ``data.run``). Events written before that carry none,
and the figures fall back to the events' own times; this module is the one place that
knows where the stamps live, so the figures never look for them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final, NamedTuple

_FIELDS: Final = ("leased_at", "spawned_at", "exited_at")


class PilotStamps(NamedTuple):
    """POSIX seconds of each step the pilot recorded (None: not recorded)."""

    leased_at: float | None = None
    spawned_at: float | None = None
    exited_at: float | None = None
    pid: int | None = None


NO_STAMPS: Final = PilotStamps()


def stamps_of(data: Any) -> PilotStamps:
    """What ``data`` (an event's payload, or a run result inside one) records."""
    found = _read(data)
    profile = getattr(data, "profile", None)
    if profile is not None:
        found = _merge(found, _read(profile))
    return found


def merge(first: PilotStamps, second: PilotStamps) -> PilotStamps:
    """``first``, with what it lacks taken from ``second``."""
    return _merge(first, second)


def _read(holder: Any) -> PilotStamps:
    times = [getattr(holder, name, None) for name in _FIELDS]
    pid = getattr(holder, "pid", None)
    if all(t is None for t in times) and pid is None:
        return NO_STAMPS
    leased, spawned, exited = (t.timestamp() if isinstance(t, datetime) else None for t in times)
    return PilotStamps(leased, spawned, exited, pid if isinstance(pid, int) else None)


def _merge(first: PilotStamps, second: PilotStamps) -> PilotStamps:
    if second is NO_STAMPS:
        return first
    if first is NO_STAMPS:
        return second
    return PilotStamps(
        first.leased_at if first.leased_at is not None else second.leased_at,
        first.spawned_at if first.spawned_at is not None else second.spawned_at,
        first.exited_at if first.exited_at is not None else second.exited_at,
        first.pid if first.pid is not None else second.pid,
    )
