"""Little's law on a synthetic steady-state run: L = λW within its batch-means interval.

Two sites, each an infinite-server queue with Poisson arrivals (seeded): alpha at 1 job/s
with exponential sojourns of mean 8 s (L ≈ 8), beta at 0.25 job/s with mean 20 s (L ≈ 5),
over 1,500 s. The window ends at ``until`` while jobs are still in the system, so λW and L
differ by the cut; the batch-means interval must cover that difference.
"""

from __future__ import annotations

import random
import uuid
from datetime import timedelta

import pytest

from lodestream.client.analytics.figures.common import Unavailable
from lodestream.client.analytics.figures.little import LittleRow, littles_law
from lodestream.client.analytics.selection import Selection
from lodestream.client.analytics.stats import Interval, batch_means, percentile, spread, t975
from lodestream.client.analytics.summary import summarize
from lodestream.client.analytics.window import Window
from tests.support.analytics import T0, T0_S, Log

HORIZON_S = 1500.0
SITES = {"alpha": (1.0, 8.0), "beta": (0.25, 20.0)}  # arrivals per second, mean sojourn (s)


def steady_log(seed: int = 7) -> Log:
    rng = random.Random(seed)
    stays: list[tuple[str, float, float]] = []  # site, arrival, departure
    for site, (rate, mean) in SITES.items():
        at = rng.expovariate(rate)
        while at <= HORIZON_S:
            stays.append((site, at, at + rng.expovariate(1 / mean)))
            at += rng.expovariate(rate)
    # Every arrival and departure in time order, as the log holds them.
    moments = sorted([(a, "in", i) for i, (_, a, _) in enumerate(stays)]
                     + [(d, "out", i) for i, (_, _, d) in enumerate(stays)])  # fmt: skip
    log, session = Log(), uuid.uuid4()
    jobs: dict[int, uuid.UUID] = {}
    for at, step, i in moments:
        if step == "in":
            jobs[i] = job = log.created(at, site=stays[i][0])
            log.preprocessed(job, at)
            log.started(job, at, session)
        else:
            log.finished_by_pilot(jobs[i], at, session)
    return log


@pytest.fixture(scope="module")
def rows() -> tuple[LittleRow, ...]:
    loaded = steady_log().loaded(Selection.of(until=T0 + timedelta(seconds=HORIZON_S)))
    summary = summarize(loaded)
    assert summary.window == Window(T0_S + min(j.created_at - T0_S
                                               for j in loaded.timelines.jobs.values()),
                                    T0_S + HORIZON_S)  # fmt: skip
    assert not isinstance(summary.little, Unavailable)
    return summary.little


def test_littles_law_holds_per_site_within_its_interval(rows: tuple[LittleRow, ...]) -> None:
    assert [r.site for r in rows] == ["alpha", "beta"]
    for row in rows:
        rate, mean = SITES[row.site]
        assert row.holds, row
        assert row.difference is not None
        assert row.difference.batches == 10
        # The estimates are of the queue they came from (loose: it is one random sample).
        assert row.arrival_rate == pytest.approx(rate, rel=0.15)
        assert row.mean_in_system == pytest.approx(rate * mean, rel=0.25)
        assert row.relative_difference is not None
        assert abs(row.relative_difference) < 0.1
        interval = row.relative_interval
        assert interval is not None
        assert interval.low <= 0 <= interval.high


def test_a_biased_measure_falls_outside_the_interval(rows: tuple[LittleRow, ...]) -> None:
    # The interval is narrow enough to mean something: L off by 50 % would not hold.
    for row in rows:
        assert row.difference is not None
        assert not row.difference.contains(0.5 * row.mean_in_system)


def test_a_window_with_no_length_has_no_law() -> None:
    log = Log()
    log.created(0)
    jobs = log.loaded().timelines.jobs.values()
    assert isinstance(littles_law(jobs, Window(T0_S, T0_S)), Unavailable)


def test_statistics_by_hand() -> None:
    assert percentile([5, 1, 4, 2, 3], 95) == 5
    assert percentile(list(range(1, 21)), 95) == 19  # nearest rank: ceil(0.95 x 20) = 19
    assert percentile(list(range(1, 101)), 50) == 50
    found = spread([2.0, 4.0, 6.0])
    assert found is not None
    assert (found.mean, found.sd, found.p95) == (4.0, 2.0, 6.0)
    assert spread([]) is None
    assert batch_means([1.0]) is None
    interval = batch_means([1.0, 3.0])  # mean 2, sd √2, t(1) = 12.706: ± 12.706 x √2 / √2
    assert interval == Interval(2.0, 12.706, 2)
    assert t975(40) == 1.96
