"""The time axis of the figures: the analysed :class:`Window` and its :class:`Bins`.

Interval figures (nodes busy, jobs waiting) are time averages per bin: an interval adds its
weight times its overlap with each bin, divided by the bin's width, so a job that runs for
half of a bin on two nodes adds one node to that bin's mean.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

TARGET_BINS: Final = 40
_NICE: Final = (1.0, 2.0, 5.0)


@dataclass(frozen=True, slots=True)
class Window:
    """The analysed span, POSIX seconds: ``start`` ≤ every figure's time ≤ ``end``."""

    start: float
    end: float

    @property
    def span(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Bins:
    """``count`` bins of ``width`` seconds from ``start``; the last one may end past the window."""

    start: float
    width: float
    count: int

    @classmethod
    def over(cls, window: Window, width: float | None = None) -> Bins:
        """Bins covering ``window``: of ``width`` seconds, or a round width giving about
        :data:`TARGET_BINS` of them."""
        if width is not None and width <= 0:
            raise ValueError(f"a bin width must be positive, got {width}")
        width = width or nice_width(window.span)
        return cls(window.start, width, max(1, math.ceil(window.span / width - 1e-9)))

    def edges(self) -> list[float]:
        return [self.start + i * self.width for i in range(self.count + 1)]

    def index(self, at: float) -> int:
        """The bin holding ``at`` (the window's end falls in the last bin)."""
        return min(self.count - 1, max(0, int((at - self.start) // self.width)))


def nice_width(span: float) -> float:
    """A width of 1, 2 or 5 x 10^k seconds that cuts ``span`` into about TARGET_BINS bins."""
    if span <= 0:
        return 1.0
    raw = span / TARGET_BINS
    power = 10.0 ** math.floor(math.log10(raw))
    for step in _NICE:
        if step * power >= raw:
            return step * power
    return 10.0 * power


def time_average(
    intervals: Iterable[tuple[float, float, float]], bins: Bins, end: float
) -> list[float]:
    """Per bin, the time average of the summed weights of ``(start, stop, weight)`` intervals.

    Each interval is clipped to [bins.start, end]; the last bin is averaged over its part
    inside the window only, so a bin cut short by the window's end is not diluted.
    """
    totals = [0.0] * bins.count
    first, width, count = bins.start, bins.width, bins.count
    last = count - 1
    # Hundreds of thousands of intervals: Bins.index is inlined, the bin an interval starts
    # in is handled before the loop over the later ones (most end in it), and min and max of
    # two floats are written as the comparisons they make (the same one of the two, ties
    # included). Each total adds the same terms in the same order as before: the same sums.
    for begins, ends, weight in intervals:
        start = first if first > begins else begins  # max(begins, first)
        stop = end if end < ends else ends  # min(ends, end)
        if stop <= start:
            continue
        i = int((start - first) // width)
        i = last if i > last else (i if i > 0 else 0)
        low = first + i * width
        high = low + width
        overlap = (high if high < stop else stop) - (low if low > start else start)
        if overlap > 0:
            totals[i] += overlap * weight
        while stop > high and i < last:
            i += 1
            low = first + i * width
            high = low + width
            overlap = (high if high < stop else stop) - (low if low > start else start)
            if overlap > 0:
                totals[i] += overlap * weight
    widths = [min(width, end - (first + i * width)) for i in range(count)]
    return [t / w if w > 0 else 0.0 for t, w in zip(totals, widths, strict=True)]
