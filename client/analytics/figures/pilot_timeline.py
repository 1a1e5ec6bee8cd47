"""Each pilot session's timeline: its runs on its slots (a Gantt chart), and how many ran.

A slot is a core the pilot placed the run on (``job.started``'s placement, ``host:core``);
a run placed on several cores appears on each. Runs of pilots that record no placement are
packed onto the fewest lanes that keep them apart, in start order. Concurrency is exact,
not binned: the number of the session's runs going on, changing at each start and end.
Times are POSIX seconds; a run or session still going ends at the window's end.
"""

from __future__ import annotations

import heapq
import re
import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from lodestream.client.analytics.pilots import SessionInterval
from lodestream.client.analytics.timeline import JobTimeline, RunOutcome
from lodestream.client.analytics.window import Window


@dataclass(frozen=True, slots=True)
class Bar:
    lane: str
    start: float
    stop: float
    app: str
    outcome: RunOutcome | None  # None: still running when the log read ends


@dataclass(frozen=True, slots=True)
class SessionTimeline:
    session_id: uuid.UUID
    site: str
    opened_at: float
    ended_at: float
    cores: int
    lanes: tuple[str, ...]  # top to bottom
    bars: tuple[Bar, ...]
    concurrency: tuple[tuple[float, int], ...]  # (time, runs going on from then)

    @property
    def peak(self) -> int:
        return max((n for _, n in self.concurrency), default=0)


def pilot_timelines(
    jobs: Iterable[JobTimeline], sessions: Iterable[SessionInterval], window: Window
) -> tuple[SessionTimeline, ...]:
    """One timeline per session, in the order they opened."""
    runs: dict[uuid.UUID, list[tuple[float, float, str, RunOutcome | None, tuple[str, ...]]]]
    runs = defaultdict(list)
    for job in jobs:
        for run in job.runs:
            if run.session_id is not None:
                stop = run.ended_at if run.ended_at is not None else window.end
                runs[run.session_id].append((run.started_at, stop, job.app, run.outcome,
                                             run.slots))  # fmt: skip
    ordered = sorted(sessions, key=lambda s: s.opened_seq)
    return tuple(_timeline(s, sorted(runs.get(s.session_id, [])), window) for s in ordered)


def _timeline(
    session: SessionInterval,
    runs: list[tuple[float, float, str, RunOutcome | None, tuple[str, ...]]],
    window: Window,
) -> SessionTimeline:
    bars: list[Bar] = []
    unplaced = [(start, stop) for start, stop, _, _, slots in runs if not slots]
    packed = iter(pack(unplaced))
    for start, stop, app, outcome, slots in runs:
        for lane in slots or (f"lane {next(packed)}",):
            bars.append(Bar(lane, start, stop, app, outcome))
    lanes = tuple(sorted({b.lane for b in bars}, key=_natural))
    ended = session.ended_at if session.ended_at is not None else window.end
    return SessionTimeline(session.session_id, session.site, session.opened_at, ended,
                           session.cores, lanes, tuple(bars),
                           concurrency([(start, stop) for start, stop, *_ in runs]))  # fmt: skip


def pack(intervals: list[tuple[float, float]]) -> list[int]:
    """A lane for each of ``intervals`` (sorted by start): the lowest one free by then."""
    free: list[int] = []
    busy: list[tuple[float, int]] = []  # (stop, lane)
    lanes = []
    for start, stop in intervals:
        while busy and busy[0][0] <= start:
            heapq.heappush(free, heapq.heappop(busy)[1])
        lane = heapq.heappop(free) if free else len(busy)
        heapq.heappush(busy, (stop, lane))
        lanes.append(lane)
    return lanes


def concurrency(intervals: Iterable[tuple[float, float]]) -> tuple[tuple[float, int], ...]:
    """The step function of how many ``intervals`` are open: (time, count from then)."""
    changes: dict[float, int] = defaultdict(int)
    for start, stop in intervals:
        changes[start] += 1
        changes[stop] -= 1
    steps, open_now = [], 0
    for at in sorted(changes):
        open_now += changes[at]
        steps.append((at, open_now))
    return tuple(steps)


def _natural(lane: str) -> list[tuple[int, str]]:
    """node10:3 after node2:3: numbers compare as numbers (zero-padded to one width)."""
    return [(0, p.zfill(20)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", lane)]
