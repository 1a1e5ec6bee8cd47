"""The few statistics the figures need: spread of a sample, and batch-means intervals.

Exact on purpose (no interpolation): the tests compare hand-computed figures with ``==``.
``p50`` and ``p95`` are nearest-rank percentiles (the smallest value with at least 50 %,
95 % of the sample at or below it: ``p50`` is the lower median); ``sd`` is the sample
standard deviation (n - 1), 0 for one value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

# Student's t, two-sided 95 % (the 0.975 quantile), by degrees of freedom; 1.96 beyond.
_T975: Final = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Spread:
    """Summary of a sample of durations (seconds)."""

    n: int
    mean: float
    sd: float
    p95: float
    min: float
    max: float
    p50: float  # the median (nearest rank): these latencies are skewed


def percentile(values: Sequence[float], q: int) -> float:
    """Nearest-rank percentile, ``q`` in 1..100, of a non-empty sample."""
    ordered = sorted(values)
    rank = max(1, -(-q * len(ordered) // 100))  # ceil(q/100 * n) in integers: no float error
    return ordered[rank - 1]


def spread(values: Sequence[float]) -> Spread | None:
    """Mean ± sd, p95, min, max and p50 of ``values``; None for an empty sample."""
    if not values:
        return None
    n = len(values)
    mean = math.fsum(values) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return Spread(n, mean, sd, percentile(values, 95), min(values), max(values),
                  percentile(values, 50))  # fmt: skip


def t975(degrees_of_freedom: int) -> float:
    """Student's t 0.975 quantile (95 % two-sided) for ``degrees_of_freedom`` ≥ 1."""
    if degrees_of_freedom < 1:
        raise ValueError("a t quantile needs at least one degree of freedom")
    if degrees_of_freedom <= len(_T975):
        return _T975[degrees_of_freedom - 1]
    return 1.96


@dataclass(frozen=True, slots=True)
class Interval:
    """A 95 % confidence interval from batch means: ``mean ± half_width`` over ``batches``."""

    mean: float
    half_width: float
    batches: int

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high


def batch_means(values: Sequence[float]) -> Interval | None:
    """The interval of the mean of per-batch estimates ``values``; None with fewer than two."""
    k = len(values)
    if k < 2:
        return None
    mean = math.fsum(values) / k
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (k - 1))
    return Interval(mean, t975(k - 1) * sd / math.sqrt(k), k)
