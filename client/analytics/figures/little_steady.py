"""Little's law over a steady window, where it says something.

Over a run that starts and ends empty, L = λW is an identity (both sides are the total time
jobs spent in the system over T), so it checks nothing. Inside the run it is a statement
about a steady state: over a window where arrivals and departures balance, the mean number
in the system L should match λ (arrivals in the window over its length) times W (the mean
time in the system of the jobs that arrived in it, measured to their own ends). The window
is the middle half of the run, from its first arrival to its last departure, unless one is
chosen (``--window``); a run whose jobs all arrived in a burst has no such window, and says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from lodestream.client.analytics.figures.common import Unavailable

Stay = tuple[float, float | None]  # arrival, departure (None: still in the system)
BALANCE: Final = 0.2  # departures within 20 % of arrivals: the window is steady enough
MIDDLE: Final = "the middle half of the run"
CHOSEN: Final = "the chosen window"


@dataclass(frozen=True, slots=True)
class SteadyLittle:
    """L, λ and W over ``[start, end]`` (POSIX seconds), and how steady that window was."""

    start: float
    end: float
    chosen: str  # MIDDLE or CHOSEN
    arrivals: int
    departures: int
    mean_in_system: float  # L
    arrival_rate: float  # λ, jobs/s
    mean_sojourn: float  # W, s, of the jobs that arrived in the window and finished

    @property
    def lambda_w(self) -> float:
        return self.arrival_rate * self.mean_sojourn

    @property
    def relative_gap(self) -> float | None:
        """(λW - L) / L (None: no job in the system over the window)."""
        if self.mean_in_system == 0:
            return None
        return (self.lambda_w - self.mean_in_system) / self.mean_in_system

    @property
    def balanced(self) -> bool:
        return abs(self.departures - self.arrivals) <= max(1.0, BALANCE * self.arrivals)


def middle_half(stays: list[Stay], end: float) -> tuple[float, float]:
    """The middle half of the span from the first arrival to the last departure."""
    first = min(a for a, _ in stays)
    last = max(end if d is None else d for _, d in stays)
    quarter = (last - first) / 4
    return first + quarter, last - quarter


def steady_little(
    stays: list[Stay], end: float, chosen: tuple[float, float] | None = None
) -> SteadyLittle | Unavailable:
    """Little's law's three terms over ``chosen`` (POSIX seconds) or the middle half."""
    low, high = chosen if chosen is not None else middle_half(stays, end)
    where = CHOSEN if chosen is not None else MIDDLE
    if high <= low:
        return Unavailable(f"{where} has no length: the run is too short to hold a steady window")
    arrived = [(a, d) for a, d in stays if low <= a < high]
    if not arrived:
        return Unavailable(
            f"no job arrived in {where} ({low - stays_start(stays):.1f} s to "
            f"{high - stays_start(stays):.1f} s after the first arrival): the jobs came in a "
            "burst, so no window is steady (choose one with --window)"
        )
    done = [d - a for a, d in arrived if d is not None]
    if not done:
        return Unavailable(f"none of the {len(arrived)} jobs that arrived in {where} finished")
    span = high - low
    departures = sum(1 for _, d in stays if d is not None and low <= d < high)
    in_system = math.fsum(_overlap(a, end if d is None else d, low, high) for a, d in stays)
    return SteadyLittle(low, high, where, len(arrived), departures, in_system / span,
                        len(arrived) / span, math.fsum(done) / len(done))  # fmt: skip


def stays_start(stays: list[Stay]) -> float:
    return min(a for a, _ in stays)


def _overlap(arrival: float, departure: float, low: float, high: float) -> float:
    return max(0.0, min(departure, high) - max(arrival, low))
