"""The simulator's inputs: events folded into recorded jobs, the trust rule on each line,
calibration by hand, and the CLI's answers to bad input."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from lodestream.client.analytics.simulate.calibrate import IOModel, calibrate
from lodestream.client.analytics.simulate.engine import simulate
from lodestream.client.analytics.simulate.errors import NothingToCalibrate
from lodestream.client.analytics.simulate.model import Scenario
from lodestream.client.analytics.simulate.recorded import recording
from lodestream.client.analytics.simulate.source import Refusals, from_lines
from lodestream.client.cli.main import app
from lodestream.schemas.codec import to_document
from lodestream.schemas.envelope import Event
from lodestream.schemas.events import (
    JobCreated,
    JobFinished,
    JobPreprocessed,
    JobRestartReady,
    JobRunErrored,
    JobStarted,
    SessionOpened,
)
from lodestream.schemas.events.job import (
    FinishedData,
    Placement,
    RetryData,
    RunProfile,
    RunResultData,
    StartedData,
    StepData,
)
from lodestream.schemas.events.session import SessionOpenedData
from lodestream.schemas.resources import JobSpec, NodeInfo

T0 = datetime(2025, 5, 1, tzinfo=UTC)
SITE = "alpha"
SESSION = uuid.UUID("01900000-0000-7000-8000-0000000000a1")


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def one_job(created: float, runnable: float, started: float, exited: float) -> list[Event]:
    """A job the pilot ran and finished itself, with a profile (process 10 ms after lease)."""
    job_id = uuid.uuid4()
    spec = JobSpec(site=SITE, app="demo", workdir=str(job_id), node_packing_count=4)
    actor = f"launcher:{SESSION}"
    profile = RunProfile(leased_at=at(started), spawning_at=at(started),
                         started_at=at(started + 0.01), exited_at=at(exited), pid=7)  # fmt: skip
    return [
        JobCreated.create(site=SITE, aggregate_id=job_id, actor="user:ada", data=spec,
                          occurred_at=at(created)),
        JobPreprocessed.create(site=SITE, aggregate_id=job_id, actor="controller:c",
                               data=StepData(work=spec), occurred_at=at(runnable)),
        JobStarted.create(site=SITE, aggregate_id=job_id, actor=actor,
                          data=StartedData(session_id=SESSION), occurred_at=at(started)),
        JobFinished.create(site=SITE, aggregate_id=job_id, actor=actor,
                           occurred_at=at(exited + 0.02),
                           data=FinishedData(run=RunResultData(return_code=0, profile=profile))),
    ]  # fmt: skip


def session() -> SessionOpened:
    data = SessionOpenedData(hostname="h", nodes=(NodeInfo(hostname="n1", cores=2),),
                             deadline=at(3600), heartbeat_ttl_s=10)  # fmt: skip
    return SessionOpened.create(site=SITE, aggregate_id=SESSION, actor=f"launcher:{SESSION}",
                                data=data, occurred_at=at(-1))  # fmt: skip


def events() -> list[Event]:
    # One slot in use at a time on a 2-core node: the second job waits for the first.
    return [session(), *one_job(0.0, 0.1, 0.2, 1.2), *one_job(0.0, 0.1, 1.3, 2.3)]


def test_a_recording_takes_each_jobs_times_and_its_profiles_run_time() -> None:
    recorded = recording(events())
    first, second = sorted(recorded.jobs, key=lambda j: j.started)
    assert first.created == T0.timestamp()
    assert first.runnable == at(0.1).timestamp()
    assert first.run_s == pytest.approx(0.99)  # started_at → exited_at of the profile
    assert first.held_s == pytest.approx(1.02)  # lease → result
    assert second.per_node == 4
    assert recorded.pilots[0].slots_per_node == (2,)


def test_calibration_by_hand() -> None:
    cal = calibrate(recording(events()))
    first, second = sorted(cal.jobs, key=lambda j: j.attempts[0].dispatch_s)
    # Two slots, open from the pilot's first lease (0.2): the first job's dispatch is none,
    # the second's from then to its lease.
    dispatch = {round(j.attempts[0].dispatch_s, 6) for j in (first, second)}
    assert dispatch == {0.0, 1.1}
    assert first.prepare_s == pytest.approx(0.1)
    assert cal.pilots == {SITE: (cal.pilots[SITE][0],)}
    assert cal.pilots[SITE][0].slots_per_node == (2,)  # min(cores 2, packing 4)
    assert cal.makespan_s == pytest.approx(2.32)
    assert cal.capacity_source == "session events"


def test_no_finished_job_is_a_clear_error() -> None:
    unfinished = [e for e in events() if not isinstance(e, JobFinished)]
    with pytest.raises(NothingToCalibrate, match="none finished"):
        calibrate(recording(unfinished))


def test_lines_that_fail_the_trust_rule_are_skipped_and_counted() -> None:
    good = [orjson.dumps(to_document(e)) for e in events()]
    forged = to_document(events()[1])
    forged["actor"] = f"launcher:{SESSION}"  # job.created is the control plane's to append
    elsewhere = {"subject": "evt.beta.job.x.created", **to_document(events()[1])}
    lines = [*good, b"not json", orjson.dumps(forged), orjson.dumps(elsewhere), b""]
    refusals = Refusals()
    kept = list(from_lines(lines, refusals))
    assert len(kept) == len(good)
    assert refusals.count == 3


def test_the_cli_predicts_from_a_file_and_refuses_nonsense(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(to_document(e)) for e in events()))
    runner = CliRunner()
    ok = runner.invoke(app, ["analytics", "simulate", "--from-file", str(path), "--slots", "4",
                             "--json"])  # fmt: skip
    assert ok.exit_code == 0, ok.output
    answer = orjson.loads(ok.stdout)
    assert answer["recorded"]["makespan_s"] == pytest.approx(2.32)
    assert answer["predicted"]["makespan_s"] > 0
    for args, message in (
        (["--slots", "0"], "slots must be between 1"),
        (["--since", "2100-01-01T00:00:00+00:00"], "no job in the recording"),
        (["--site", "nowhere"], "no events in the range"),
        (["--bandwidth", "1e9"], "I/O model"),
        (["--io-fraction", "0.5"], "both --io-fraction and --recorded-bandwidth"),
    ):
        bad = runner.invoke(app, ["analytics", "simulate", "--from-file", str(path), *args])
        assert bad.exit_code == 1, (args, bad.output)
        assert message in bad.output, (args, bad.output)
        assert "Traceback" not in bad.output
    missing = runner.invoke(app, ["analytics", "simulate", "--from-file", str(tmp_path / "no")])
    assert missing.exit_code == 1
    assert "cannot read" in missing.output


def test_replaying_the_recording_gives_it_back_with_and_without_the_io_term() -> None:
    recorded = recording(events())
    for io in (None, IOModel(0.5, 1e9), IOModel(0.9, 10.0)):
        cal = calibrate(recorded, io)
        assert simulate(cal, Scenario()).makespan_s == pytest.approx(cal.makespan_s, rel=1e-6)


def test_a_retry_and_a_chain_are_recorded_as_structure() -> None:
    parent, child = uuid.uuid4(), uuid.uuid4()
    spec = JobSpec(site=SITE, app="flaky", workdir="p")
    actor = f"launcher:{SESSION}"
    lease = StartedData(session_id=SESSION, placement=(Placement(hostname="n1"),))
    history: list[Event] = [
        JobCreated.create(site=SITE, aggregate_id=parent, actor="user:ada", data=spec,
                          occurred_at=at(0)),
        JobCreated.create(site=SITE, aggregate_id=child, actor="user:ada",
                          data=JobSpec(site=SITE, app="demo", workdir="c", parent_ids=(parent,)),
                          occurred_at=at(0)),
        JobPreprocessed.create(site=SITE, aggregate_id=parent, actor="controller:c",
                               data=StepData(work=spec), occurred_at=at(0.1)),
        JobStarted.create(site=SITE, aggregate_id=parent, actor=actor, data=lease,
                          occurred_at=at(0.2)),
        JobRunErrored.create(site=SITE, aggregate_id=parent, actor=actor,
                             data=RunResultData(return_code=1, runtime_s=1.0),
                             occurred_at=at(1.2)),
        JobRestartReady.create(site=SITE, aggregate_id=parent, actor="site:alpha",
                               data=RetryData(attempt=2, backoff_s=0.5, retry_at=at(1.8)),
                               occurred_at=at(1.3)),
        JobStarted.create(site=SITE, aggregate_id=parent, actor=actor, data=lease,
                          occurred_at=at(1.9)),
        JobFinished.create(site=SITE, aggregate_id=parent, actor=actor, occurred_at=at(2.9),
                           data=FinishedData(run=RunResultData(return_code=0, runtime_s=1.0))),
        JobPreprocessed.create(site=SITE, aggregate_id=child, actor="controller:c",
                               data=StepData(), occurred_at=at(3.0)),
        JobStarted.create(site=SITE, aggregate_id=child, actor=actor, data=lease,
                          occurred_at=at(3.1)),
        JobFinished.create(site=SITE, aggregate_id=child, actor=actor, occurred_at=at(4.1),
                           data=FinishedData(run=RunResultData(return_code=0, runtime_s=1.0))),
    ]  # fmt: skip
    cal = calibrate(recording(history))
    first, second = cal.jobs
    assert second.parents == (0,)
    assert second.prepare_s == pytest.approx(0.1)  # the parent's end → the child runnable
    assert [a.requeue_s for a in first.attempts] == pytest.approx([0.0, 0.1])
    assert [a.backoff_s for a in first.attempts] == pytest.approx([0.0, 0.5])
    assert cal.retries == 1
    # No session event: the pilot is one node, named by the placements, one run at a time.
    assert cal.pilots[SITE][0].slots_per_node == (1,)
    assert "placements" in cal.capacity_source
    assert simulate(cal, Scenario()).makespan_s == pytest.approx(cal.makespan_s)
    # A second slot does not shorten a chain: the child waits for its parent's retry.
    assert simulate(cal, Scenario(slots=2)).makespan_s == pytest.approx(cal.makespan_s)
