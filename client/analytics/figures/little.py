"""Little's law per site, L = λW, with its three terms measured apart.

Over the window [t0, t1] of length T, for the jobs of one site (in the system from
``job.created`` until the final state they are in at the end of the log read):

* L, the mean number of jobs in the system: the time integral of that number, over T;
* λ, the arrival rate: jobs created in the window, over T;
* W, the mean time in the system of the jobs created in the window that reached a final
  state, each from its own timeline (not from L).

On a run that starts and ends empty λW equals L exactly; on a window cut through a busy
run they differ by what the cut leaves out, which shrinks as the window grows. The window
is also cut into :data:`BATCHES` equal batches, the three terms measured in each, and the
batch differences λ_b·W_b - L_b give a 95 % interval (batch means) around the overall
difference: the law holds within the measurement when that interval contains 0.

Since the whole-window figure of a run that starts and ends empty is an identity, each row
also carries the law over a steady window (:mod:`.little_steady`), and says in words what
its verdict rests on (:attr:`LittleRow.verdict`).
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from lodestream.client.analytics.figures.common import Unavailable
from lodestream.client.analytics.figures.little_steady import SteadyLittle, steady_little
from lodestream.client.analytics.stats import Interval, batch_means
from lodestream.client.analytics.timeline import JobTimeline
from lodestream.client.analytics.window import Window

BATCHES: Final = 10


@dataclass(frozen=True, slots=True)
class LittleRow:
    site: str
    jobs: int  # created in the window
    completed: int  # of those, in a final state
    mean_in_system: float  # L
    arrival_rate: float  # λ, jobs/s
    mean_sojourn: float | None  # W, s (None: none completed)
    difference: Interval | None  # of λ_b·W_b - L_b over the batches (None: too few)
    batches: int = BATCHES  # batches in which a job arrived and finished
    identity: bool = False  # every job arrived and left inside the window: λW = L exactly
    steady: SteadyLittle | Unavailable | None = None  # the law over a steady window

    @property
    def lambda_w(self) -> float | None:
        return None if self.mean_sojourn is None else self.arrival_rate * self.mean_sojourn

    @property
    def relative_difference(self) -> float | None:
        """(λW - L) / L."""
        if self.lambda_w is None or self.mean_in_system == 0:
            return None
        return (self.lambda_w - self.mean_in_system) / self.mean_in_system

    @property
    def relative_interval(self) -> Interval | None:
        """The batch-means interval of the difference, relative to L."""
        if self.difference is None or self.mean_in_system == 0:
            return None
        scale = self.mean_in_system
        d = self.difference
        return Interval(d.mean / scale, d.half_width / scale, d.batches)

    @property
    def holds(self) -> bool | None:
        """The law holds within the batch-means interval (None: no interval)."""
        return None if self.difference is None else self.difference.contains(0.0)

    @property
    def verdict(self) -> str:
        """What the whole-window figure says, in words (never blank)."""
        if self.identity:
            return "identity over a run that starts and ends empty"
        if self.holds is None:
            return (f"no verdict: only {self.batches} of {BATCHES} batches had a job arrive "
                    "and finish (bursty arrivals)")  # fmt: skip
        return "holds" if self.holds else "does not hold"


Stay = tuple[float, float | None]  # arrival, departure (None: still in the system)


def littles_law(
    jobs: Iterable[JobTimeline], window: Window, steady: tuple[float, float] | None = None
) -> tuple[LittleRow, ...] | Unavailable:
    """Per site; ``steady`` is the steady window in seconds from the window's start (default:
    the middle half of each site's run)."""
    if window.span <= 0:
        return Unavailable("the window has no length: Little's law needs time to pass")
    stays: dict[str, list[Stay]] = defaultdict(list)
    for job in jobs:
        if window.start <= job.created_at <= window.end:
            stays[job.site].append((job.created_at, job.final_at))
    if not stays:
        return Unavailable("no job was created in the window")
    chosen = None if steady is None else (window.start + steady[0], window.start + steady[1])
    return tuple(_row(site, stays[site], window, chosen) for site in sorted(stays))


def _row(
    site: str, stays: list[Stay], window: Window, chosen: tuple[float, float] | None = None
) -> LittleRow:
    in_system, rate, sojourn, completed = _terms(stays, window.start, window.end)
    step = window.span / BATCHES
    lows = [window.start + b * step for b in range(BATCHES)]
    highs = [window.start + (b + 1) * step for b in range(BATCHES)]
    # A million events make ~100,000 stays a site: each batch finds its arrivals by bisection
    # and its L from the stays that overlap it, instead of walking every stay 20 times.
    # math.fsum is exactly rounded, so the sums do not depend on which zero terms are left
    # out or in what order the rest come: the figures are those of the walk over all stays.
    by_arrival = sorted(stays, key=_arrival)
    arrivals = [a for a, _ in by_arrival]
    overlaps = _overlaps(stays, lows, highs)
    differences = []
    for b, (low, high) in enumerate(zip(lows, highs, strict=True)):
        first = bisect.bisect_left(arrivals, low)
        # Arrivals in [low, high), and the last batch keeps one exactly at its end.
        cut = bisect.bisect_right if b == BATCHES - 1 else bisect.bisect_left
        arrived = by_arrival[first : cut(arrivals, high)]
        l_b = math.fsum(overlaps[b]) / (high - low)
        w_b = _mean_sojourn(arrived)
        if w_b is not None:
            differences.append(len(arrived) / (high - low) * w_b - l_b)
    identity = all(d is not None and d <= window.end for _, d in stays)
    return LittleRow(site, len(stays), completed, in_system, rate, sojourn,
                     batch_means(differences), len(differences), identity,
                     steady_little(stays, window.end, chosen))  # fmt: skip


def _overlaps(stays: list[Stay], lows: list[float], highs: list[float]) -> list[list[float]]:
    """Per batch [lows[b], highs[b]], the time each stay overlapping it spent in it: the
    terms :func:`_in_system` sums over that batch, less those that are 0."""
    parts: list[list[float]] = [[] for _ in lows]
    for a, d in stays:
        # Only batches ending after the arrival and (if it left) starting before the
        # departure can hold a term above 0; each is computed as _in_system computes it.
        last = len(lows) if d is None else bisect.bisect_left(lows, d)
        for b in range(bisect.bisect_right(highs, a), last):
            low, high = lows[b], highs[b]
            parts[b].append(_overlap(a, d, low, high))
    return parts


def _arrival(stay: Stay) -> float:
    return stay[0]


def _mean_sojourn(stays: list[Stay]) -> float | None:
    done = [d - a for a, d in stays if d is not None]
    return math.fsum(done) / len(done) if done else None


def _terms(stays: list[Stay], start: float, end: float) -> tuple[float, float, float | None, int]:
    """L over [start, end] of ``stays``, their arrival rate, mean sojourn, and completions."""
    completed = sum(1 for _, d in stays if d is not None)
    rate = len(stays) / (end - start)
    return _in_system(stays, start, end), rate, _mean_sojourn(stays), completed


def _in_system(stays: list[Stay], start: float, end: float) -> float:
    return math.fsum(_overlap(a, d, start, end) for a, d in stays) / (end - start)


def _overlap(arrival: float, departure: float | None, start: float, end: float) -> float:
    """Seconds of [start, end] the stay spent in the system: max(0, min(departure, end) -
    max(arrival, start)), an open stay departing at ``end``, written as the comparisons min
    and max make (the same one of the two, ties included), which is faster than the calls."""
    stop = end if departure is None or end < departure else departure
    begin = start if start > arrival else arrival
    overlap = stop - begin
    return overlap if overlap > 0.0 else 0.0
