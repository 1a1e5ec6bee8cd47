"""Reading copies of the log, and bad input: clear words, never a traceback.

A copy made by ``lode analytics export`` (one message a line) folds exactly as the stream
does; ``lode events --json`` rows are read too; lines that hold no message, events the
shared rule refuses and illegal transitions are counted and listed, never fatal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from lodestream.client.analytics.errors import NothingSelected, SourceError
from lodestream.client.analytics.intake import MAX_LISTED, IntakeReport, Raw
from lodestream.client.analytics.jsonl import export_line
from lodestream.client.analytics.load import load_file
from lodestream.client.analytics.selection import Selection
from lodestream.client.analytics.simulate.source import Refusals, from_lines
from lodestream.client.analytics.summary import summarize
from lodestream.schemas.fold import JobView, apply
from tests.support.analytics import T0, Log, hand_log

GARBAGE = Raw(999, "evt.alpha.job.0190a000-0000-7000-8000-000000000000.finished", b"{oops")


def write_copy(path: Path, log: Log, extra: list[Raw] | None = None) -> Path:
    path.write_bytes(b"".join(export_line(r) for r in [*log.raws(), *(extra or [])]))
    return path


def api_rows(log: Log) -> list[dict[str, Any]]:
    """The job events as ``GET /events`` (and so ``lode events --json``) shows them."""
    rows: list[dict[str, Any]] = []
    views: dict[uuid.UUID, JobView] = {}
    for seq, event in log.events:
        if event.kind != "job":
            continue
        before = views.get(event.aggregate_id)
        views[event.aggregate_id] = view = apply(before, event, seq)
        rows.append({
            "seq": seq, "job_id": str(event.aggregate_id), "event_id": str(event.id),
            "site": event.site, "type": event.type,
            "from_state": before.state.value if before else None, "to_state": view.state.value,
            "occurred_at": event.occurred_at.isoformat(), "actor": event.actor,
            "data": event.data.model_dump(mode="json"),
        })  # fmt: skip
    return rows


def test_a_copy_folds_as_the_stream_does(tmp_path: Path) -> None:
    log = hand_log()
    copied = load_file(write_copy(tmp_path / "events.jsonl", log, [GARBAGE]))
    direct = log.loaded()
    assert copied.timelines.jobs == direct.timelines.jobs
    assert copied.timelines.sessions == direct.timelines.sessions
    assert copied.timelines.batches == direct.timelines.batches
    assert (copied.intake.read, copied.intake.refused) == (len(log.events) + 1, 1)
    (refusal,) = copied.intake.listed
    assert (refusal.seq, refusal.stage) == (999, "shared rule")


def test_the_simulator_reads_the_same_copy(tmp_path: Path) -> None:
    log = hand_log()
    path = write_copy(tmp_path / "events.jsonl", log, [GARBAGE])
    refusals = Refusals()
    with path.open("rb") as lines:
        events = list(from_lines(lines, refusals))
    assert [e.id for e in events] == [e.id for _, e in log.events]
    assert refusals.count == 1  # the garbage line, refused by the same rule


def test_the_rows_lode_events_prints_are_read_too(tmp_path: Path) -> None:
    log = hand_log()
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in api_rows(log)))
    summary = summarize(load_file(path))
    assert summary.jobs_by_state == {"JOB_FINISHED": 3, "FAILED": 1}
    assert summary.intake.skipped == 0
    assert (summary.sessions, summary.batch_jobs) == (0, 0)  # the API's feed has job events only
    direct = summarize(log.loaded())
    assert summary.stages == direct.stages


def test_lines_that_hold_no_message_are_counted(tmp_path: Path) -> None:
    log = hand_log()
    path = write_copy(tmp_path / "events.jsonl", log)
    with path.open("a") as handle:
        handle.write('not json at all\n[1, 2]\n{"seq": 5}\n\n')
    loaded = load_file(path)
    assert loaded.intake.unreadable == 3
    assert [r.reason.split(":")[0] for r in loaded.intake.listed] == ["line 33", "line 34",
                                                                      "line 35"]  # fmt: skip
    assert len(loaded.timelines.jobs) == 4


def test_the_refusals_listed_are_those_of_lowest_sequence() -> None:
    # As a replay meets them: a batch's shared-rule refusals, then its illegal transitions
    # (lower sequences among them), then a later batch's.
    report = IntakeReport()
    for seq in range(200, 200 + MAX_LISTED):
        report.refuse(seq, "s", "shared rule", "refused")
    report.refuse(7, "s", "transition", "illegal")
    report.refuse(400, "s", "shared rule", "refused")
    report.refuse(3, "s", "transition", "illegal")
    assert [r.seq for r in report.listed] == [3, 7, *range(200, 200 + MAX_LISTED - 2)]
    assert (report.refused, report.illegal) == (MAX_LISTED + 1, 2)


def test_a_file_that_is_no_copy_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="cannot read"):
        load_file(tmp_path / "missing.jsonl")
    notes = tmp_path / "notes.txt"
    notes.write_text("".join(f"line {i}\n" for i in range(20)))
    with pytest.raises(SourceError, match="is not a copy of the log"):
        load_file(notes)


def test_empty_ranges_and_filters_that_match_nothing_say_why(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(NothingSelected, match="no event in the range read"):
        summarize(load_file(empty))
    copy = write_copy(tmp_path / "events.jsonl", hand_log())
    with pytest.raises(NothingSelected, match=r"no job or pilot matches \(site beta\)"):
        summarize(load_file(copy, Selection.of(sites=["beta"])))
    with pytest.raises(NothingSelected, match=r"no job matches \(app nope\)"):
        summarize(load_file(copy, Selection.of(apps=["nope"])))
    later = Selection.of(since_seq=10_000)
    with pytest.raises(NothingSelected, match="no event in the range read"):
        summarize(load_file(copy, later))
    refused = tmp_path / "refused.jsonl"
    refused.write_bytes(export_line(GARBAGE))
    with pytest.raises(NothingSelected, match="all 1 events read were refused"):
        summarize(load_file(refused))


def lode(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    argv = [sys.executable, "-m", "lodestream.client.cli.main", "analytics", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, env=env)


def test_the_command_answers_bad_input_without_a_traceback(tmp_path: Path) -> None:
    log = hand_log()
    copy = write_copy(tmp_path / "events.jsonl", log, [GARBAGE])
    unfinished = Log()
    job = unfinished.created(0)
    unfinished.preprocessed(job, 1)
    running = write_copy(tmp_path / "running.jsonl", unfinished)

    missing = lode("summary", "--from-file", str(tmp_path / "nope.jsonl"))
    nothing = lode("summary", "--from-file", str(copy), "--app", "nope")
    since = lode("summary", "--from-file", str(copy), "--since", "yesterday")
    backwards = lode("summary", "--from-file", str(copy), "--since", T0.isoformat(),
                     "--until", (T0 - timedelta(hours=1)).isoformat())  # fmt: skip
    shown = lode("summary", "--from-file", str(running))
    listed = lode("summary", "--from-file", str(copy), "--json")
    for result in (missing, nothing, since, backwards, shown, listed):
        assert "Traceback" not in result.stdout + result.stderr, result.stderr
    assert missing.returncode == 1
    assert "error: cannot read" in missing.stderr
    assert nothing.returncode == 1
    assert "no job matches (app nope)" in nothing.stderr
    assert since.returncode == 2
    assert "give a duration" in since.stderr
    assert backwards.returncode == 2
    assert "the range is empty" in backwards.stderr
    assert shown.returncode == 0, shown.stderr
    assert "no job of the selection finished: Table 1 needs finished jobs" in shown.stdout
    assert listed.returncode == 0, listed.stderr
    figures = json.loads(listed.stdout)
    assert figures["read"]["refused_by_shared_rule"] == 1
    assert figures["read"]["refusals"][0]["seq"] == 999
    assert figures["jobs_by_state"] == {"JOB_FINISHED": 3, "FAILED": 1}
    assert figures["stages"]["rows"][4]["mean_s"] == 36.0
