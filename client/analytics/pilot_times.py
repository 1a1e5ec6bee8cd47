"""The pilot's own timestamps of a run, where its events carry them.

Pilots record per-step stamps (RADICAL-Pilot style) in the run's result event, under
``data.profile`` (``RunResultData.profile``; a ``job.finished`` that stands for the run
carries it in ``data.run.profile``): ``leased_at`` (its ``job.started``, the lease, was
acknowledged), ``spawning_at`` (it began spawning the task), ``started_at`` (the process
was started), ``exited_at`` (it saw the process end) and the task's ``pid``. The same names
are also read flat in ``data``, where ``spawned_at`` stands for ``started_at``. Events written
before pilots recorded them carry none, and the figures fall back to the events' own times;
this module is the one place that knows where the stamps live.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final, NamedTuple


class PilotStamps(NamedTuple):
    """POSIX seconds of each step the pilot recorded (None: not recorded)."""

    leased_at: float | None = None
    spawning_at: float | None = None
    started_at: float | None = None  # the process was started
    exited_at: float | None = None
    pid: int | None = None


NO_STAMPS: Final = PilotStamps()


def stamps_of(data: Any) -> PilotStamps:
    """What ``data`` (an event's payload, or a run result inside one) records."""
    flat = PilotStamps(
        _seconds(getattr(data, "leased_at", None)),
        _seconds(getattr(data, "spawning_at", None)),
        _seconds(getattr(data, "spawned_at", None)),
        _seconds(getattr(data, "exited_at", None)),
        _pid(getattr(data, "pid", None)),
    )
    profile = getattr(data, "profile", None)
    if profile is None:
        return flat if flat != NO_STAMPS else NO_STAMPS
    nested = PilotStamps(
        _seconds(getattr(profile, "leased_at", None)),
        _seconds(getattr(profile, "spawning_at", None)),
        _seconds(getattr(profile, "started_at", None)),
        _seconds(getattr(profile, "exited_at", None)),
        _pid(getattr(profile, "pid", None)),
    )
    return merge(nested, flat)


def merge(first: PilotStamps, second: PilotStamps) -> PilotStamps:
    """``first``, with what it lacks taken from ``second``."""
    if second is NO_STAMPS:
        return first
    if first is NO_STAMPS:
        return second
    return PilotStamps(
        first.leased_at if first.leased_at is not None else second.leased_at,
        first.spawning_at if first.spawning_at is not None else second.spawning_at,
        first.started_at if first.started_at is not None else second.started_at,
        first.exited_at if first.exited_at is not None else second.exited_at,
        first.pid if first.pid is not None else second.pid,
    )


def _seconds(value: object) -> float | None:
    return value.timestamp() if isinstance(value, datetime) else None


def _pid(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
