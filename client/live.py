"""Live aggregates per site, folded from the watched events (no API polling).

:class:`SiteLive` is a pure fold: :meth:`SiteLive.apply` takes one event and its arrival
time, and the view is read off the state. Per site it knows each job's state as of the
events it has seen (the backlog by state, what runs), the jobs that finished in the last
:data:`WINDOW_S` seconds (done per second), and the latest failures with their cause.

A watch started at ``since=1`` sees every job from its creation. One started later
learns a job when its next event arrives, and counts it from then on: the backlog is
then "jobs that moved since the watch began", which is what a live view shows.
"""

from __future__ import annotations

import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Final

from lodestream.client.watch import Watched
from lodestream.schemas.envelope import Event
from lodestream.schemas.states import FINAL, TRANSITIONS, JobState

WINDOW_S: Final = 10.0
RECENT_FAILURES: Final = 10
_FAILURES: Final = frozenset({"job.failed", "job.run_errored", "job.run_timed_out"})


@dataclass(frozen=True, slots=True)
class Failure:
    seq: int
    job: uuid.UUID
    type: str
    cause: str


@dataclass(slots=True)
class SiteLive:
    """What one site is doing, as a fold of its events."""

    site: str
    states: dict[uuid.UUID, JobState] = field(default_factory=dict)
    finished_at: deque[float] = field(default_factory=deque)
    failures: deque[Failure] = field(default_factory=lambda: deque(maxlen=RECENT_FAILURES))
    events: int = 0
    last_seq: int = 0

    def apply(self, item: Watched, now: float) -> None:
        """Fold one event received at ``now`` (a monotonic clock, in seconds)."""
        self.events += 1
        self.last_seq = item.seq
        event = item.event
        transition = TRANSITIONS.get(event.type)
        if transition is None:
            return
        if transition.target is not None:
            if transition.target in FINAL:
                self.states.pop(event.aggregate_id, None)  # finished jobs leave the backlog
            else:
                self.states[event.aggregate_id] = transition.target
        if transition.target == JobState.JOB_FINISHED:
            self.finished_at.append(now)
        if event.type in _FAILURES:
            self.failures.append(Failure(item.seq, event.aggregate_id, event.type, cause_of(event)))
        self._expire(now)

    def _expire(self, now: float) -> None:
        while self.finished_at and self.finished_at[0] < now - WINDOW_S:
            self.finished_at.popleft()

    def backlog(self) -> Counter[JobState]:
        """Jobs by state, final states excluded."""
        return Counter(self.states.values())

    @property
    def running(self) -> int:
        return sum(1 for s in self.states.values() if s == JobState.RUNNING)

    def done_per_s(self, now: float) -> float:
        self._expire(now)
        return len(self.finished_at) / WINDOW_S


def cause_of(event: Event) -> str:
    """The words a failure event gives for itself: reason, cause chain, return code, stderr."""
    data = event.data
    parts = [str(getattr(data, "reason", "") or "")]
    parts += [str(c) for c in getattr(data, "cause", ()) or ()]
    code = getattr(data, "return_code", None)
    if code is not None:
        parts.append(f"exit {code}")
    tail = str(getattr(data, "stderr_tail", "") or "").strip().splitlines()
    if tail:
        parts.append(tail[-1])
    return "; ".join(p for p in parts if p) or event.type


@dataclass(slots=True)
class LiveView:
    """Every watched site's :class:`SiteLive`."""

    sites: dict[str, SiteLive] = field(default_factory=dict)

    def apply(self, item: Watched, now: float) -> None:
        self.sites.setdefault(item.site, SiteLive(item.site)).apply(item, now)
