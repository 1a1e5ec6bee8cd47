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

import functools
from datetime import datetime
from typing import Any, Final, NamedTuple

from pydantic import BaseModel


class PilotStamps(NamedTuple):
    """POSIX seconds of each step the pilot recorded (None: not recorded)."""

    leased_at: float | None = None
    spawning_at: float | None = None
    started_at: float | None = None  # the process was started
    exited_at: float | None = None
    pid: int | None = None


NO_STAMPS: Final = PilotStamps()


_NAMES: Final = ("leased_at", "spawning_at", "spawned_at", "started_at", "exited_at", "pid",
                  "profile")  # fmt: skip


@functools.cache
def _present(cls: type[Any]) -> frozenset[str]:
    # Asking a pydantic model for a field it lacks costs microseconds (its __getattr__ runs
    # and raises); a replay asks every event, so which names a payload class has is known once.
    if issubclass(cls, BaseModel):
        return frozenset(name for name in _NAMES if name in cls.model_fields)
    return frozenset(_NAMES)


def stamps_of(data: Any) -> PilotStamps:
    """What ``data`` (an event's payload, or a run result inside one) records."""
    present = _present(data.__class__)
    # Most payloads that could carry stamps carry none (null): those end here, cheaply.
    values = {name: value for name in present if (value := getattr(data, name, None)) is not None}
    if not values:
        return NO_STAMPS
    flat = PilotStamps(
        _seconds(values.get("leased_at")),
        _seconds(values.get("spawning_at")),
        _seconds(values.get("spawned_at")),
        _seconds(values.get("exited_at")),
        _pid(values.get("pid")),
    )
    profile = values.get("profile")
    if profile is None:
        return flat if flat != NO_STAMPS else NO_STAMPS
    inner = _present(profile.__class__)
    nested = {name: getattr(profile, name, None) for name in inner}
    found = PilotStamps(
        _seconds(nested.get("leased_at")),
        _seconds(nested.get("spawning_at")),
        _seconds(nested.get("started_at")),
        _seconds(nested.get("exited_at")),
        _pid(nested.get("pid")),
    )
    return merge(found, flat)


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
