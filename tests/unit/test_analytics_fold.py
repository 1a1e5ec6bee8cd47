"""The replay fold: timelines per job and attempt, pilot intervals, selection, and what it skips."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from lodestream.client.analytics.errors import AnalyticsError
from lodestream.client.analytics.figures.latency import StageTable, stage_table
from lodestream.client.analytics.figures.pilot import PilotOverhead, pilot_overhead
from lodestream.client.analytics.fold import fold_timelines
from lodestream.client.analytics.intake import Raw
from lodestream.client.analytics.pilot_times import NO_STAMPS, PilotStamps, merge, stamps_of
from lodestream.client.analytics.selection import Selection
from lodestream.client.analytics.stats import Spread
from lodestream.client.analytics.timeline import RunRecord
from lodestream.schemas.codec import encode
from lodestream.schemas.events import JobFinished, JobStarted
from lodestream.schemas.events.job import FinishedData, StartedData
from lodestream.schemas.states import JobState
from tests.support.analytics import T0, T0_S, Log, hand_log

S = JobState


def test_a_timeline_records_each_state_per_attempt_with_skipped_steps() -> None:
    log = hand_log()
    jobs = log.loaded().timelines.jobs
    c = next(j for j in jobs.values() if j.node_packing_count == 2)
    assert [(e.state, e.at - T0_S, e.attempt) for e in c.entries] == [
        (S.CREATED, 10, 1), (S.READY, 12, 1), (S.STAGED_IN, 12, 1), (S.PREPROCESSED, 12, 1),
        (S.RUNNING, 20, 1), (S.RUN_ERROR, 24, 1), (S.RESTART_READY, 25, 2), (S.RUNNING, 28, 2),
        (S.RUN_DONE, 58, 2), (S.POSTPROCESSED, 58, 2), (S.STAGED_OUT, 58, 2),
        (S.JOB_FINISHED, 58, 2),
    ]  # fmt: skip
    assert (c.state, c.attempts, c.nodes, c.final_at) == (S.JOB_FINISHED, 2, 0.5, T0_S + 58)
    first, second = c.runs
    assert (first.attempt, first.outcome, first.return_code) == (1, "errored", 3)
    assert (second.attempt, second.outcome, second.runtime_s) == (2, "done", 27.0)
    assert second.ended_at == T0_S + 58
    assert second.reported_by_pilot
    (failure,) = c.failures
    assert (failure.type, failure.cause, failure.return_code, failure.stderr_tail) == (
        "job.run_errored",
        ("task failed",),
        3,
        "disk full",
    )


def test_a_job_created_runnable_enters_its_skipped_steps_at_creation() -> None:
    log = Log()
    session = uuid.uuid4()
    job = log.created(0, runnable=True)
    log.started(job, 2, session)
    log.finished_by_pilot(job, 7, session)
    (timeline,) = log.loaded().timelines.jobs.values()
    assert [(e.state, e.at - T0_S) for e in timeline.entries[:4]] == [
        (S.CREATED, 0), (S.READY, 0), (S.STAGED_IN, 0), (S.PREPROCESSED, 0)]  # fmt: skip
    table = stage_table([timeline])
    assert isinstance(table, StageTable)
    assert table.row("run delay").spread == Spread(1, 2.0, 0.0, 2.0, 2.0, 2.0, 2.0)
    assert table.row("stage in").skipped == 1


def test_a_job_carries_its_spec_and_a_separate_lease() -> None:
    jobs = hand_log().loaded().timelines.jobs
    a = next(j for j in jobs.values() if j.app == "reco")
    assert (a.site, a.tags, a.num_nodes, a.ranks, a.created_at) == (
        "alpha",
        {"beam": "1"},
        1,
        1,
        T0_S,
    )
    (run,) = a.runs
    assert (run.lease_event_at, run.started_at) == (T0_S + 8, T0_S + 10)
    assert run.stamps is NO_STAMPS


def test_sessions_and_batch_jobs_become_intervals() -> None:
    timelines = hand_log().loaded().timelines
    (session,) = timelines.sessions.values()
    (batch,) = timelines.batches.values()
    assert (session.nodes, session.cores, session.opened_at, session.ended_at, session.end) == (
        4,
        32,
        T0_S,
        T0_S + 60,
        "closed",
    )
    assert session.batch_job_id == batch.batch_id
    assert (batch.num_nodes, batch.running_at, batch.finished_at, batch.scheduler_id) == (
        4,
        T0_S + 5,
        T0_S + 55,
        "123",
    )


def test_the_selection_keeps_a_jobs_later_events_with_it() -> None:
    log = hand_log()
    beam_1 = log.loaded(Selection.of(tags={"beam": "1"})).timelines
    assert sorted(j.app for j in beam_1.jobs.values()) == ["demo", "reco"]  # A and C
    assert all(j.state is S.JOB_FINISHED for j in beam_1.jobs.values())
    reco = log.loaded(Selection.of(apps=["reco"])).timelines
    assert len(reco.jobs) == 1
    assert reco.counts.not_selected > 0
    late = log.loaded(Selection.of(since=T0 + timedelta(seconds=10))).timelines
    assert {j.created_at - T0_S for j in late.jobs.values()} == {10, 20}
    early = log.loaded(Selection.of(until=T0 + timedelta(seconds=5))).timelines
    assert {j.created_at - T0_S for j in early.jobs.values()} == {0}
    other_site = log.loaded(Selection.of(sites=["beta"])).timelines
    assert other_site.empty


def test_events_of_jobs_created_before_the_range_are_counted_apart() -> None:
    log = hand_log()
    created_c = next(seq for seq, e in log.events if e.type == "job.created" and
                     e.data.node_packing_count == 2)  # type: ignore[attr-defined]  # fmt: skip
    timelines = log.loaded(Selection.of(since_seq=created_c)).timelines
    assert len(timelines.jobs) == 2  # C and D
    assert len(timelines.counts.begun_before_jobs) == 2  # A and B: their later events only
    assert timelines.counts.begun_before > 0


def test_refused_and_illegal_events_are_counted_listed_and_skipped() -> None:
    log = Log()
    job = log.created(0)
    session = uuid.uuid4()
    log.preprocessed(job, 1)
    log.started(job, 2, session)
    # A forged finish: a launcher of another site claims it (refused by the shared rule).
    forged = JobFinished.create(site="alpha", aggregate_id=job, actor="site:beta",
                                occurred_at=log.at(3), data=FinishedData())  # fmt: skip
    # A second start of a running job: legal to the rule, illegal to the state machine.
    again = JobStarted.create(site="alpha", aggregate_id=job, actor=f"launcher:{session}",
                              occurred_at=log.at(4),
                              data=StartedData(session_id=session))  # fmt: skip
    extra = [
        Raw(100, forged.subject, encode(forged)),
        Raw(101, again.subject, encode(again)),
        Raw(102, "evt.alpha.job.nope.created", b"{not json"),
    ]
    loaded = log.loaded(extra=extra)
    assert (loaded.intake.read, loaded.intake.accepted) == (6, 4)
    assert (loaded.intake.refused, loaded.intake.illegal) == (2, 1)
    listed = {r.seq: r for r in loaded.intake.listed}
    assert {seq: r.stage for seq, r in listed.items()} == {
        100: "shared rule",
        101: "transition",
        102: "shared rule",
    }
    assert "signed by site:beta" in listed[100].reason
    assert "not allowed from RUNNING" in listed[101].reason
    assert "not JSON" in listed[102].reason
    (timeline,) = loaded.timelines.jobs.values()
    assert timeline.state is S.RUNNING  # neither the forgery nor the replay moved it


def test_the_fold_is_a_pure_function_of_typed_events() -> None:
    log = hand_log()
    direct = fold_timelines(log.events)
    replayed = log.loaded().timelines
    assert direct.jobs == replayed.jobs
    assert direct.sessions == replayed.sessions
    assert direct.batches == replayed.batches


def test_pilot_stamps_are_read_from_a_profile_or_flat_and_merged() -> None:
    class Profile:  # the shape of RunResultData.profile
        leased_at = T0 + timedelta(seconds=1)
        spawning_at = T0 + timedelta(seconds=2)
        started_at = T0 + timedelta(seconds=3)
        exited_at = None
        pid = 4242

    class Result:
        exited_at = T0 + timedelta(seconds=9)  # flat, as the brief's job.run_done data has it
        profile = Profile()

    class Started:
        spawned_at = T0 + timedelta(seconds=4)  # flat: the process was spawned (started)
        pid = True  # not a pid

    class Nothing:
        pass

    assert stamps_of(Nothing()) is NO_STAMPS
    assert stamps_of(Result()) == PilotStamps(T0_S + 1, T0_S + 2, T0_S + 3, T0_S + 9, 4242)
    assert stamps_of(Started()) == PilotStamps(started_at=T0_S + 4)
    assert merge(PilotStamps(exited_at=5.0), PilotStamps(1.0, 2.0, 3.0, 4.0, 7)) == PilotStamps(
        1.0, 2.0, 3.0, 5.0, 7
    )


def test_pilot_overhead_uses_the_stamps_where_runs_have_them() -> None:
    stamped = RunRecord(1, None, started_at=T0_S + 10, started_seq=5,
                        stamps=PilotStamps(T0_S + 10.5, T0_S + 11, T0_S + 11.25, T0_S + 20, 99),
                        ended_at=T0_S + 20.5, outcome="done", reported_by_pilot=True,
                        runtime_s=8.0)  # fmt: skip
    plain = RunRecord(1, None, started_at=T0_S + 10, started_seq=9, ended_at=T0_S + 19,
                      outcome="done", reported_by_pilot=True, runtime_s=8.5)  # fmt: skip
    job = hand_log().loaded().timelines.jobs.popitem()[1]
    job.runs = [stamped, plain]
    overhead = pilot_overhead([job])
    assert isinstance(overhead, PilotOverhead)
    lease, spawn, report = (overhead.row(s) for s in ("lease → start", "spawn → start",
                                                      "run end → reported"))  # fmt: skip
    assert (lease.spread.n, lease.spread.max, lease.stamped) == (2, 0.75, 1)  # 11.25 - 10.5
    assert (spawn.spread.n, spawn.spread.mean, spawn.stamped) == (1, 0.25, 1)
    assert sorted([report.spread.min, report.spread.max]) == [0.5, 0.5]  # 20.5-20, 19-(10+8.5)
    assert report.stamped == 1


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        ({"sites": ["Not A Site"]}, "site"),
        ({"since_seq": 0}, "start sequence must be 1 or more"),
        ({"since": T0.replace(tzinfo=None)}, "time zone"),
        ({"since": T0, "until": T0}, "the range is empty"),
    ],
)
def test_a_selection_refuses_nonsense(arguments: dict[str, object], words: str) -> None:
    with pytest.raises(AnalyticsError, match=words):
        Selection.of(**arguments)  # type: ignore[arg-type]
