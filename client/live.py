"""Live aggregates per site, folded from the watched events (no API polling).

:class:`SiteLive` is a pure fold: :meth:`SiteLive.apply` takes one event and its arrival
time, and the view is read off the state. Per site it knows each unfinished job's state,
how many jobs ended in each final state (the totals), the jobs that finished in the last
:data:`WINDOW_S` seconds (done per second), and the latest failures with their cause.

A job moves by the projector's own rule (:func:`~lodestream.schemas.fold.state_after`),
skipped steps included: a job created runnable is PREPROCESSED here as in ``GET /jobs``.

A view seeded with the API's snapshot (:meth:`LiveView.seed`, ``GET /ui/api/summary``)
and fed the events after the snapshot's position holds the read model's counts at every
position. Unseeded, a watch started at ``since=1`` sees every job from its creation; one
started later learns a job when its next event arrives, and counts it from then on.

A :class:`Selection` (an app, tags) keeps the jobs whose ``job.created`` matches, and the
unfinished ones the seed named; a job that ended before the watch began is not followed
again if it is reset.
"""

from __future__ import annotations

import uuid
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from lodestream.client.watch import Watched
from lodestream.schemas.envelope import Event
from lodestream.schemas.events.job import JobCreated
from lodestream.schemas.fold import skipped_steps, state_after
from lodestream.schemas.ids import short_id
from lodestream.schemas.states import FINAL, TRANSITIONS, JobState

WINDOW_S: Final = 10.0
RECENT_FAILURES: Final = 10
# A pilot's refusal too: the one word on a job that waits for a pilot that never comes.
_FAILURES: Final = frozenset(
    {"job.failed", "job.run_errored", "job.run_timed_out", "job.placement_refused"}
)
_RESETTABLE: Final = frozenset({JobState.FAILED, JobState.KILLED})


@dataclass(frozen=True, slots=True)
class Failure:
    seq: int
    job: uuid.UUID
    type: str
    cause: str

    @property
    def short(self) -> str:
        """The part of the job's id a person tells jobs apart by."""
        return short_id(self.job)


@dataclass(frozen=True, slots=True)
class Selection:
    """Which jobs a view follows: those of ``app`` with every one of ``tags`` (all jobs when
    neither is given)."""

    app: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)

    @property
    def everything(self) -> bool:
        return self.app is None and not self.tags

    def admits(self, created: JobCreated) -> bool:
        spec = created.data
        if self.app is not None and spec.app != self.app:
            return False
        return all(spec.tags.get(key) == value for key, value in self.tags.items())


@dataclass(slots=True)
class SiteLive:
    """What one site is doing, as a fold of its events."""

    site: str
    selection: Selection = field(default_factory=Selection)
    states: dict[uuid.UUID, JobState] = field(default_factory=dict)  # unfinished jobs
    totals: Counter[JobState] = field(default_factory=Counter)  # jobs in each final state
    ended: dict[uuid.UUID, JobState] = field(default_factory=dict)  # seen failed or killed
    finished_at: deque[float] = field(default_factory=deque)
    failures: deque[Failure] = field(default_factory=lambda: deque(maxlen=RECENT_FAILURES))
    events: int = 0
    last_seq: int = 0

    def seed(
        self, counts: Mapping[str, int], jobs: Mapping[uuid.UUID, JobState], position: int
    ) -> None:
        """Start from the read model at ``position``: its unfinished jobs and final counts."""
        self.states = dict(jobs)
        self.totals = Counter({JobState(s): n for s, n in counts.items() if JobState(s) in FINAL})
        self.last_seq = position

    def apply(self, item: Watched, now: float) -> None:
        """Fold one event received at ``now`` (a monotonic clock, in seconds)."""
        self.events += 1
        self.last_seq = item.seq
        self._expire(now)
        event = item.event
        if event.type not in TRANSITIONS:
            return
        job = event.aggregate_id
        before = self.states.get(job) or self.ended.get(job)
        if before is None and not self._admits(event):
            return
        if event.type in _FAILURES:
            self.failures.append(Failure(item.seq, job, event.type, cause_of(event)))
        after = state_after(before, event.type, skipped_steps(event))
        if after is None or after == before:
            return  # a lease event: the state does not change
        self._leave(job, before)
        if after in FINAL:
            self.totals[after] += 1
            if after in _RESETTABLE:
                self.ended[job] = after
            if after == JobState.JOB_FINISHED:
                self.finished_at.append(now)
        else:
            self.states[job] = after

    def _admits(self, event: Event) -> bool:
        if isinstance(event, JobCreated):
            return self.selection.admits(event)
        return self.selection.everything  # an unknown job's app and tags are not known here

    def _leave(self, job: uuid.UUID, before: JobState | None) -> None:
        if before is None:
            return
        if before in FINAL:
            self.totals[before] -= 1
            self.ended.pop(job, None)
        else:
            del self.states[job]

    def _expire(self, now: float) -> None:
        while self.finished_at and self.finished_at[0] < now - WINDOW_S:
            self.finished_at.popleft()

    def backlog(self) -> Counter[JobState]:
        """Jobs by state, final states excluded."""
        return Counter(self.states.values())

    def counts(self) -> Counter[JobState]:
        """Jobs by state, final states included (what ``GET /jobs`` counts for the site)."""
        return +(self.backlog() + self.totals)

    @property
    def finished(self) -> int:
        return self.totals[JobState.JOB_FINISHED]

    @property
    def failed(self) -> int:
        return self.totals[JobState.FAILED]

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
    selection: Selection = field(default_factory=Selection)

    @classmethod
    def of(cls, sites: Iterable[str], selection: Selection | None = None) -> LiveView:
        chosen = selection or Selection()
        return cls({site: SiteLive(site, chosen) for site in sites}, chosen)

    def seed(self, summary: Mapping[str, Any]) -> int:
        """Start every site from the API's snapshot (``GET /ui/api/summary``, taken with this
        view's selection); returns its position: watch from the next sequence."""
        position = int(summary["position"])
        jobs: dict[str, dict[uuid.UUID, JobState]] = {}
        for job_id, (site, state) in summary["jobs"].items():
            jobs.setdefault(site, {})[uuid.UUID(job_id)] = JobState(state)
        for name, site in self.sites.items():
            site.seed(summary["counts"].get(name, {}), jobs.get(name, {}), position)
        for f in sorted(summary["failures"], key=lambda f: f["seq"]):
            site = self.sites.get(f["site"])
            if site is None:
                continue
            job = uuid.UUID(f["job_id"])
            site.failures.append(Failure(f["seq"], job, f["state"], f["cause"]))
            if f["state"] == JobState.FAILED:
                site.ended[job] = JobState.FAILED  # so that a reset moves it out of the total
        return position

    def apply(self, item: Watched, now: float) -> None:
        self.sites.setdefault(item.site, SiteLive(item.site, self.selection)).apply(item, now)
