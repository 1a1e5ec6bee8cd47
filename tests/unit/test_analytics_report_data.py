"""What the report's plots and new tables are drawn from (issue 35): bins drawn their full
width, a colour per state, jobs in each state, failures by app, exit code and first stderr
line, each pilot's timeline, the headline figures, and Little's law over a steady window."""

from __future__ import annotations

import itertools

import pytest

from lodestream.client.analytics.figures.common import Unavailable
from lodestream.client.analytics.figures.failures import failures_by_app
from lodestream.client.analytics.figures.little import littles_law
from lodestream.client.analytics.figures.little_steady import CHOSEN, MIDDLE, SteadyLittle
from lodestream.client.analytics.figures.pilot_timeline import (
    concurrency,
    pack,
    pilot_timelines,
)
from lodestream.client.analytics.figures.states import STATE_COLOURS, edges, jobs_in_state
from lodestream.client.analytics.summary import summarize, window_of
from lodestream.client.analytics.window import Bins, Window
from lodestream.schemas.states import JobState
from tests.support.analytics import T0_S, Log, hand_log


def test_every_bin_is_drawn_its_full_width_the_first_and_last_too() -> None:
    bins = Bins.over(Window(T0_S, T0_S + 57.0), 5.0)  # the last bin ends past the window
    x = edges(bins)
    assert len(x) == bins.count + 1
    assert x[0] == 0.0
    assert [b - a for a, b in itertools.pairwise(x)] == [5.0] * bins.count


def test_every_state_has_a_colour_of_its_own() -> None:
    assert set(STATE_COLOURS) == set(JobState)
    assert len(set(STATE_COLOURS.values())) == len(JobState) >= 13


def test_the_layers_of_a_bin_add_up_to_the_jobs_in_the_system() -> None:
    loaded = hand_log().loaded()
    window = window_of(loaded)
    states = jobs_in_state(loaded.timelines.jobs.values(), window, Bins.over(window, 20.0))
    totals = [sum(layer[i] for layer in states.mean.values()) for i in range(3)]
    # a and b from 0 s, c from 10 s, d from 20 s; final states stay in the stack.
    assert totals == pytest.approx([2.5, 4.0, 4.0])
    # The ends at the bottom (they only grow), the way there above them.
    assert list(states.mean)[:2] == [JobState.FAILED, JobState.JOB_FINISHED]
    assert JobState.RUNNING in states.mean


def test_failures_are_grouped_by_app_exit_code_and_first_stderr_line() -> None:
    log = Log()
    session = log.session_opened(0, nodes=1)
    runs = (("sim", 3, "disk full\nat line 2\n"), ("sim", 3, "disk full\n"),
            ("reco", 4, "out of memory\n"), ("reco", 3, "disk full\n"))  # fmt: skip
    for app, code, stderr in runs:
        job = log.created(0, app=app, runnable=True)
        log.started(job, 1, session)
        log.run_errored(job, 2, session, code=code, stderr=stderr)
    groups = failures_by_app(log.loaded().timelines.jobs.values())
    rows = {(g.app, g.return_code, g.first_line): g.events for g in groups}
    assert rows == {("sim", 3, "disk full"): 2, ("reco", 4, "out of memory"): 1,
                    ("reco", 3, "disk full"): 1}  # fmt: skip
    assert groups[0].label == "sim · exit 3 · disk full"


def test_a_pilot_timeline_puts_each_run_on_a_free_slot() -> None:
    assert pack([(0, 10), (2, 4), (5, 6), (11, 12)]) == [0, 1, 1, 0]
    assert concurrency([(0, 10), (2, 4), (4, 6)]) == ((0, 1), (2, 2), (4, 2), (6, 1), (10, 0))
    loaded = hand_log().loaded()
    timelines = loaded.timelines
    (timeline,) = pilot_timelines(timelines.jobs.values(), timelines.sessions.values(),
                                  window_of(loaded))  # fmt: skip
    # Runs a 10-30, b 14-24, c 20-24, d 22-23, and c again 28-58: four at once at 22 s.
    assert len(timeline.bars) == 5
    assert timeline.peak == 4
    assert timeline.lanes == ("lane 0", "lane 1", "lane 2", "lane 3")
    assert (timeline.opened_at, timeline.ended_at) == (T0_S, T0_S + 60)


def test_the_headline_figures() -> None:
    headline = summarize(hand_log().loaded(), bin_s=20).headline
    assert (headline.jobs, headline.finished, headline.failed) == (4, 3, 1)
    assert headline.makespan_s == pytest.approx(58.0)
    assert headline.jobs_per_s == pytest.approx(3 / 58)
    assert headline.utilization is not None


def steady_log(arrivals: list[float], stay_s: float) -> Log:
    log = Log()
    session = log.session_opened(0, nodes=1)
    for at in arrivals:
        job = log.created(at, runnable=True)
        log.started(job, at, session)
        log.finished_by_pilot(job, at + stay_s, session, runtime_s=stay_s)
    return log


def test_littles_law_over_the_middle_of_a_steady_run() -> None:
    # One job a second for 100 s, each in the system 5 s: L = 5, λ = 1/s, W = 5 s.
    loaded = steady_log([float(i) for i in range(100)], 5.0).loaded()
    (row,) = littles_law(loaded.timelines.jobs.values(), window_of(loaded))  # type: ignore[misc]
    assert row.identity
    assert row.verdict == "identity over a run that starts and ends empty"
    steady = row.steady
    assert isinstance(steady, SteadyLittle)
    assert steady.chosen == MIDDLE
    # The run spans 0 s (the first arrival) to 104 s (the last departure).
    assert (steady.start - T0_S, steady.end - T0_S) == (26.0, 78.0)
    assert steady.balanced
    assert steady.mean_in_system == pytest.approx(5.0)
    assert (steady.arrival_rate, steady.mean_sojourn) == pytest.approx((1.0, 5.0), rel=0.02)
    assert steady.relative_gap is not None
    assert abs(steady.relative_gap) < 0.02


def test_a_chosen_window_and_a_burst_say_what_they_are() -> None:
    loaded = steady_log([float(i) for i in range(100)], 5.0).loaded()
    jobs, window = loaded.timelines.jobs.values(), window_of(loaded)
    (row,) = littles_law(jobs, window, steady=(10.0, 30.0))  # type: ignore[misc]
    assert isinstance(row.steady, SteadyLittle)
    assert (row.steady.chosen, row.steady.arrivals) == (CHOSEN, 20)
    burst = steady_log([0.0] * 20, 5.0).loaded()
    (row,) = littles_law(burst.timelines.jobs.values(), window_of(burst))  # type: ignore[misc]
    assert isinstance(row.steady, Unavailable)
    assert "burst" in row.steady.reason
    assert row.verdict  # never blank: identity, or why there is no verdict
