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
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from lodestream.client.analytics.figures.common import Unavailable
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


Stay = tuple[float, float | None]  # arrival, departure (None: still in the system)


def littles_law(jobs: Iterable[JobTimeline], window: Window) -> tuple[LittleRow, ...] | Unavailable:
    if window.span <= 0:
        return Unavailable("the window has no length: Little's law needs time to pass")
    stays: dict[str, list[Stay]] = defaultdict(list)
    for job in jobs:
        if window.start <= job.created_at <= window.end:
            stays[job.site].append((job.created_at, job.final_at))
    if not stays:
        return Unavailable("no job was created in the window")
    return tuple(_row(site, stays[site], window) for site in sorted(stays))


def _row(site: str, stays: list[Stay], window: Window) -> LittleRow:
    in_system, rate, sojourn, completed = _terms(stays, window.start, window.end)
    step = window.span / BATCHES
    differences = []
    for b in range(BATCHES):
        low, high = window.start + b * step, window.start + (b + 1) * step
        arrived = [s for s in stays if low <= s[0] < high or (b == BATCHES - 1 and s[0] == high)]
        l_b = _in_system(stays, low, high)
        _, r_b, w_b, _ = _terms(arrived, low, high)
        if w_b is not None:
            differences.append(r_b * w_b - l_b)
    return LittleRow(site, len(stays), completed, in_system, rate, sojourn,
                     batch_means(differences))  # fmt: skip


def _terms(stays: list[Stay], start: float, end: float) -> tuple[float, float, float | None, int]:
    """L over [start, end] of ``stays``, their arrival rate, mean sojourn, and completions."""
    span = end - start
    done = [d - a for a, d in stays if d is not None]
    sojourn = math.fsum(done) / len(done) if done else None
    return _in_system(stays, start, end), len(stays) / span, sojourn, len(done)


def _in_system(stays: list[Stay], start: float, end: float) -> float:
    total = math.fsum(
        max(0.0, min(d if d is not None else end, end) - max(a, start)) for a, d in stays
    )
    return total / (end - start)
