"""The figures of a synthetic log, against answers computed by hand.

The log (:func:`tests.support.analytics.hand_log`), seconds from T0, one site, one pilot
session of 4 nodes open over [0, 60], inside a 4-node batch job running over [5, 55]:

====  =======================================================================================
job   events
====  =======================================================================================
A     created 0, ready 2, staged_in 5, preprocessed 6, leased 8, started 10, run_done 30,
      postprocessed 31, staged_out 35, finished 36                         (1 node)
B     created 0, preprocessed 12 (skips ready, staged_in), started 14, finished by the pilot
      24 (stands for run_done, postprocessed, staged_out)                  (2 nodes)
C     created 10, preprocessed 12, started 20, run_errored 24 (exit 3), restart_ready 25,
      started 28 (attempt 2), finished by the pilot 58                     (packing 2: ½ node)
D     created 20, preprocessed 21, started 22, run_errored 23 (exit 1), failed 24   (1 node)
====  =======================================================================================

The window is [0, 60] (first and last event); bins of 20 s: [0,20) [20,40) [40,60].

* Table 1 over the finished A, B, C: run delay 4, 2, 3 (C from its RESTART_READY at 25);
  run 20, 10, 30; time to solution 36, 24, 48; overhead 16, 14, 18; stage in and stage out
  only A (3 and 4), skipped by B and C.
* Busy node-seconds: bin 0: A 10x1 + B 6x2 = 22; bin 1: A 10 + B 4x2 + C 4x½ + C 12x½ + D 1
  = 27; bin 2: C 18x½ = 9. Means: 1.1, 1.35, 0.45 nodes; provisioned 4 throughout;
  allocated (batch running from 5 to 55): 15x4/20 = 3, 4, 3.
* Little: L = (36 + 24 + 48 + 4) / 60, λ = 4/60, W = 112/4 = 28, so λW = L.
"""

from __future__ import annotations

import pytest

from lodestream.client.analytics.figures.common import Unavailable
from lodestream.client.analytics.figures.latency import StageTable, stage_table
from lodestream.client.analytics.figures.little import littles_law
from lodestream.client.analytics.figures.pilot import PilotOverhead, pilot_overhead
from lodestream.client.analytics.stats import Spread
from lodestream.client.analytics.summary import Summary, summarize
from lodestream.client.analytics.window import Window
from lodestream.schemas.states import JobState
from tests.support.analytics import T0_S, hand_log

S = JobState


@pytest.fixture(scope="module")
def summary() -> Summary:
    return summarize(hand_log().loaded(), bin_s=20)


def test_the_window_and_the_jobs(summary: Summary) -> None:
    assert summary.window == Window(T0_S, T0_S + 60)
    assert summary.jobs_by_state == {"JOB_FINISHED": 3, "FAILED": 1}
    assert (summary.sessions, summary.batch_jobs) == (1, 1)
    assert summary.intake.skipped == 0


def test_throughput_counts_each_entry_in_its_bin(summary: Summary) -> None:
    counts = summary.throughput.counts
    assert summary.throughput.bins.count == 3
    assert counts[S.CREATED] == (3, 1, 0)
    assert counts[S.RUNNING] == (2, 3, 0)  # C ran twice
    assert counts[S.RUN_ERROR] == (0, 2, 0)
    assert counts[S.JOB_FINISHED] == (0, 2, 1)
    assert counts[S.FAILED] == (0, 1, 0)
    assert counts[S.READY] == (3, 1, 0)  # A's own; B's, C's and D's skipped inside preprocessed
    assert counts[S.RESTART_READY] == (0, 1, 0)
    assert summary.throughput.peak_per_s(S.RUNNING) == 3 / 20


def test_utilization_weighs_runs_by_their_nodes(summary: Summary) -> None:
    u = summary.utilization
    assert u.busy == (1.1, 1.35, 0.45)
    assert u.provisioned == (4.0, 4.0, 4.0)
    assert u.allocated == (3.0, 4.0, 3.0)
    assert (u.busy_node_s, u.provisioned_node_s, u.allocated_node_s) == (58.0, 240.0, 200.0)
    assert u.overall == 58 / 240


def test_table_1(summary: Summary) -> None:
    table = summary.stages
    assert isinstance(table, StageTable)
    assert table.finished_jobs == 3
    expected = {
        "stage in": (Spread(1, 3.0, 0.0, 3.0, 3.0, 3.0, 3.0), 2),
        "run delay": (Spread(3, 3.0, 1.0, 4.0, 2.0, 4.0, 3.0), 0),
        "run": (Spread(3, 20.0, 10.0, 30.0, 10.0, 30.0, 20.0), 0),
        "stage out": (Spread(1, 4.0, 0.0, 4.0, 4.0, 4.0, 4.0), 2),
        "time to solution": (Spread(3, 36.0, 12.0, 48.0, 24.0, 48.0, 36.0), 0),
        "overhead": (Spread(3, 16.0, 2.0, 18.0, 14.0, 18.0, 16.0), 0),
    }
    assert {r.stage: (r.spread, r.skipped) for r in table.rows} == expected


def test_pilot_overhead_falls_back_to_event_times(summary: Summary) -> None:
    pilot = summary.pilot
    assert isinstance(pilot, PilotOverhead)
    assert pilot.runs == 5  # A, B, C twice, D: every run a pilot reported
    lease = pilot.row("lease → start")
    # A leased at 8 and started at 10; the others took the lease with job.started itself.
    assert (lease.spread.n, lease.spread.mean, lease.spread.max, lease.stamped) == (5, 0.4, 2, 0)
    # Reported minus (start + runtime_s): A 30 - (10 + 19), B 24 - (14 + 8), C 58 - (28 + 27);
    # the errored runs carry no runtime.
    report = pilot.row("run end → reported")
    assert report.spread == Spread(3, 2.0, 1.0, 3.0, 1.0, 3.0, 2.0)


def test_littles_law_is_exact_on_a_run_that_drains(summary: Summary) -> None:
    assert not isinstance(summary.little, Unavailable)
    (row,) = summary.little
    assert (row.site, row.jobs, row.completed) == ("alpha", 4, 4)
    assert row.mean_in_system == pytest.approx(112 / 60, rel=1e-12)
    assert row.arrival_rate == 4 / 60
    assert row.mean_sojourn == 28.0
    assert row.relative_difference == pytest.approx(0.0, abs=1e-12)


def test_failures_are_grouped_by_cause_chain(summary: Summary) -> None:
    groups = {(g.type, g.chain): g for g in summary.failures}
    errored = groups[("job.run_errored", ("task failed",))]
    assert (errored.events, errored.jobs, errored.jobs_failed) == (2, 2, 1)  # C retried, D failed
    assert errored.return_codes == (1, 3)
    failed = groups[("job.failed", ("run error on attempt 1 (retry budget exhausted)",
                                    "task failed", "boom"))]  # fmt: skip
    assert (failed.events, failed.jobs, failed.jobs_failed) == (1, 1, 1)
    assert len(groups) == 2


def test_backlog_is_jobs_in_the_system_not_running(summary: Summary) -> None:
    # In the system: A [0,36) B [0,24) C [10,58) D [20,24); running as in the utilization.
    # bin 0: 20 + 20 + 10 = 50 job-s in, runs A 10 + B 6 = 16 → (50 - 16) / 20 = 1.7
    # bin 1: 16 + 4 + 20 + 4 = 44 in, runs A 10 + B 4 + C 4 + C 12 + D 1 = 31 → 13 / 20
    # bin 2: C 18 in, C 18 running → 0
    waiting = summary.backlog.waiting["alpha"]
    assert waiting == pytest.approx((1.7, 0.65, 0.0), abs=1e-12)


def test_a_run_with_no_finished_job_says_what_is_missing() -> None:
    log = hand_log()
    log.events = [(seq, e) for seq, e in log.events if e.type != "job.finished"]
    jobs = log.loaded().timelines.jobs.values()
    missing = stage_table(jobs)
    assert isinstance(missing, Unavailable)
    assert "no job of the selection finished" in missing.reason
    # Runs still happened: the pilot figures and Little's law do not need a finished job.
    assert isinstance(pilot_overhead(jobs), PilotOverhead)
    assert not isinstance(littles_law(jobs, Window(T0_S, T0_S + 60)), Unavailable)
