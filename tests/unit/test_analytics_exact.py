"""The figures' faster methods give the very floats of the plain ones they replaced.

A million events made the figures slow: the time averages, the throughput count, Little's
law per batch and Table 1's latest entries were rewritten to do less work per item. Each
plain method is kept here as it was written, and both are run on random data made to hit
the edges (times on bin and batch boundaries, intervals before the window or past its end,
stays still in the system, entries outside the window); the results must be equal with
``==``, not approximately.
"""

from __future__ import annotations

import math
import random
import uuid

import pytest

from lodestream.client.analytics.figures import little, utilization
from lodestream.client.analytics.figures.latency import STAGES, stage_samples
from lodestream.client.analytics.figures.throughput import throughput
from lodestream.client.analytics.stats import batch_means
from lodestream.client.analytics.timeline import JobTimeline, StateEntry
from lodestream.client.analytics.window import Bins, Window, time_average
from lodestream.schemas.states import RUNNABLE, JobState

S = JobState
SEEDS = range(8)


# --- the plain methods, as they were -------------------------------------------------------


def plain_time_average(
    intervals: list[tuple[float, float, float]], bins: Bins, end: float
) -> list[float]:
    totals = [0.0] * bins.count
    first, width = bins.start, bins.width
    for begins, ends, weight in intervals:
        start, stop = max(begins, first), min(ends, end)
        if stop <= start:
            continue
        i = bins.index(start)
        while i < bins.count:
            low = first + i * width
            high = low + width
            overlap = min(stop, high) - max(start, low)
            if overlap > 0:
                totals[i] += overlap * weight
            if stop <= high:
                break
            i += 1
    widths = [min(width, end - (first + i * width)) for i in range(bins.count)]
    return [t / w if w > 0 else 0.0 for t, w in zip(totals, widths, strict=True)]


def plain_counts(jobs: list[JobTimeline], window: Window, bins: Bins) -> dict[S, tuple[int, ...]]:
    counts: dict[S, list[int]] = {}
    for job in jobs:
        for entry in job.entries:
            if window.start <= entry.at <= window.end:
                row = counts.get(entry.state)
                if row is None:
                    row = counts[entry.state] = [0] * bins.count
                row[bins.index(entry.at)] += 1
    return {state: tuple(counts[state]) for state in S if state in counts}


def plain_node_seconds(intervals: list[tuple[float, float, float]], window: Window) -> float:
    return math.fsum(
        max(0.0, min(stop, window.end) - max(start, window.start)) * weight
        for start, stop, weight in intervals
    )


Stay = tuple[float, float | None]


def plain_in_system(stays: list[Stay], start: float, end: float) -> float:
    total = math.fsum(
        max(0.0, min(d if d is not None else end, end) - max(a, start)) for a, d in stays
    )
    return total / (end - start)


def plain_terms(stays: list[Stay], start: float, end: float) -> tuple[float, float, float | None]:
    done = [d - a for a, d in stays if d is not None]
    sojourn = math.fsum(done) / len(done) if done else None
    return plain_in_system(stays, start, end), len(stays) / (end - start), sojourn


def plain_little_row(stays: list[Stay], window: Window) -> tuple[object, ...]:
    in_system, rate, sojourn = plain_terms(stays, window.start, window.end)
    step = window.span / little.BATCHES
    differences = []
    last = little.BATCHES - 1
    for b in range(little.BATCHES):
        low, high = window.start + b * step, window.start + (b + 1) * step
        arrived = [s for s in stays if low <= s[0] < high or (b == last and s[0] == high)]
        l_b = plain_in_system(stays, low, high)
        _, r_b, w_b = plain_terms(arrived, low, high)
        if w_b is not None:
            differences.append(r_b * w_b - l_b)
    return in_system, rate, sojourn, batch_means(differences)


def plain_last(job: JobTimeline, state: S) -> StateEntry | None:
    for entry in reversed(job.entries):
        if entry.state is state:
            return entry
    return None


def plain_stage_samples(jobs: list[JobTimeline]) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {stage: [] for stage in STAGES}
    steps = {"stage in": (S.READY, S.STAGED_IN), "stage out": (S.POSTPROCESSED, S.STAGED_OUT)}
    for job in jobs:
        if job.state is not S.JOB_FINISHED:
            continue
        for stage, (first, second) in steps.items():
            begin, end = plain_last(job, first), plain_last(job, second)
            if begin is not None and end is not None and begin.seq != end.seq:
                samples[stage].append(end.at - begin.at)
        running, done = plain_last(job, S.RUNNING), plain_last(job, S.RUN_DONE)
        finished, created = plain_last(job, S.JOB_FINISHED), plain_last(job, S.CREATED)
        if running is not None:
            runnable = job.last_of(RUNNABLE, running.seq)
            if runnable is not None:
                samples["run delay"].append(running.at - runnable.at)
        run = done.at - running.at if running is not None and done is not None else None
        if run is not None:
            samples["run"].append(run)
        if finished is not None and created is not None:
            samples["time to solution"].append(finished.at - created.at)
            if run is not None:
                samples["overhead"].append(finished.at - created.at - run)
    return samples


# --- random data that hits the edges -------------------------------------------------------

T0 = 1_763_900_000.123  # POSIX seconds, as the log's times are: rounding is not exact


def window_and_bins(rng: random.Random) -> tuple[Window, Bins]:
    window = Window(T0, T0 + rng.choice([59.9, 600.0, 3_601.7, 86_400.3]))
    return window, Bins.over(window, rng.choice([None, window.span / 7, window.span / 3.3]))


def moment(rng: random.Random, window: Window, edges: list[float]) -> float:
    """A time in or a little around the window, often exactly on an edge."""
    if rng.random() < 0.2:
        return rng.choice(edges)
    return window.start + rng.uniform(-0.05, 1.05) * window.span


def edges_of(window: Window, bins: Bins) -> list[float]:
    step = window.span / little.BATCHES
    batches = [window.start + b * step for b in range(little.BATCHES + 1)]
    return [*bins.edges(), *batches, window.start, window.end]


@pytest.mark.parametrize("seed", SEEDS)
def test_time_average_and_node_seconds_are_the_plain_sums(seed: int) -> None:
    rng = random.Random(seed)
    window, bins = window_and_bins(rng)
    edges = edges_of(window, bins)
    intervals = []
    for _ in range(2_000):
        a, b = sorted((moment(rng, window, edges), moment(rng, window, edges)))
        if rng.random() < 0.05:
            a, b = b, a  # a clock that went back
        intervals.append((a, b, rng.choice([1.0, 0.5, 2.0, rng.uniform(0.1, 64.0)])))
    assert time_average(intervals, bins, window.end) == plain_time_average(
        intervals, bins, window.end
    )
    node_seconds = utilization._node_seconds(intervals, window)
    assert node_seconds == plain_node_seconds(intervals, window)


def timeline(rng: random.Random, window: Window, edges: list[float]) -> JobTimeline:
    created = moment(rng, window, edges)
    job = JobTimeline(job_id=uuid.UUID(int=rng.getrandbits(128)), site="alpha", app="a",
                      tags={}, num_nodes=1, ranks=1, node_packing_count=1, wall_time_min=1,
                      created_at=created, created_seq=1)  # fmt: skip
    at, seq = created, 1
    states = list(S)
    for _ in range(rng.randint(1, 14)):
        if rng.random() < 0.7:  # a step of its own, else recorded inside the event before
            seq += 1
            at = moment(rng, window, edges) if rng.random() < 0.3 else at + rng.expovariate(0.1)
        job.entries.append(StateEntry(rng.choice(states), at, seq, 1))
    job.state = S.JOB_FINISHED if rng.random() < 0.7 else job.entries[-1].state
    return job


@pytest.mark.parametrize("seed", SEEDS)
def test_throughput_counts_as_one_entry_at_a_time(seed: int) -> None:
    rng = random.Random(seed)
    window, bins = window_and_bins(rng)
    edges = edges_of(window, bins)
    jobs = [timeline(rng, window, edges) for _ in range(500)]
    assert throughput(jobs, window, bins).counts == plain_counts(jobs, window, bins)


@pytest.mark.parametrize("seed", SEEDS)
def test_table_1_reads_the_latest_entries_as_before(seed: int) -> None:
    rng = random.Random(seed)
    window, bins = window_and_bins(rng)
    jobs = [timeline(rng, window, edges_of(window, bins)) for _ in range(500)]
    samples, _ = stage_samples(jobs)
    assert samples == plain_stage_samples(jobs)


@pytest.mark.parametrize("seed", SEEDS)
def test_littles_law_per_batch_is_the_walk_over_every_stay(seed: int) -> None:
    rng = random.Random(seed)
    window, bins = window_and_bins(rng)
    edges = [e for e in edges_of(window, bins) if window.start <= e <= window.end]
    stays: list[Stay] = []
    for _ in range(3_000):
        arrival = rng.choice(edges) if rng.random() < 0.2 else rng.uniform(window.start,
                                                                           window.end)  # fmt: skip
        departure: float | None = None
        if rng.random() < 0.8:
            departure = moment(rng, window, edges) if rng.random() < 0.3 else (
                arrival + rng.expovariate(10 / window.span))  # fmt: skip
        stays.append((arrival, departure))
    row = little._row("alpha", stays, window)
    expected = plain_little_row(stays, window)
    assert (row.mean_in_system, row.arrival_rate, row.mean_sojourn, row.difference) == expected
