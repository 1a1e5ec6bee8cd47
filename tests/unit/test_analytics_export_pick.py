"""``lode analytics export --app/--tag/--until``: a copy of only the jobs those pick.

Each picked job keeps every event it has in the log; no event of another job is copied;
sessions and batch jobs are copied whole; and the copy's analysis, unfiltered, gives what
the whole log's analysis gives with the same filters.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

from lodestream.client.analytics.intake import IntakeReport, Raw
from lodestream.client.analytics.jsonl import file_batches
from lodestream.client.analytics.load import _export, load_file
from lodestream.client.analytics.pick import JobPick
from lodestream.client.analytics.selection import Selection
from lodestream.schemas.subjects import parse_event_subject
from tests.support.analytics import T0, Log, hand_log
from tests.unit.test_analytics_input import GARBAGE


async def batches_of(raws: list[Raw], size: int = 5) -> AsyncIterator[list[Raw]]:
    for start in range(0, len(raws), size):
        yield raws[start : start + size]


def export(raws: list[Raw], out: Path, selection: Selection) -> int:
    return asyncio.run(_export(batches_of(raws), out, selection))


def job_of(raw: Raw) -> str | None:
    subject = parse_event_subject(raw.subject)
    return subject.aggregate_id if subject.kind == "job" else None


def the_jobs(log: Log) -> dict[str, list[int]]:
    """Each job's sequences in the log, read from the subjects (not through the pick)."""
    jobs: dict[str, list[int]] = {}
    for raw in log.raws():
        job = job_of(raw)
        if job is not None:
            jobs.setdefault(job, []).append(raw.seq)
    return jobs


def copied(path: Path) -> list[Raw]:
    return [raw for batch in file_batches(path, IntakeReport()) for raw in batch]


def test_an_app_picks_its_jobs_whole_and_keeps_sessions_and_batch_jobs(tmp_path: Path) -> None:
    log = hand_log()
    selection = Selection.of(apps=["reco"])
    written = export(log.raws(), tmp_path / "reco.jsonl", selection)
    kept = copied(tmp_path / "reco.jsonl")
    assert written == len(kept)
    by_job = {job for raw in kept if (job := job_of(raw)) is not None}
    (reco,) = by_job  # hand_log has one job of app reco
    assert [r.seq for r in kept if job_of(r) == reco] == the_jobs(log)[reco]
    others = [r for r in log.raws() if job_of(r) is None]
    assert [r for r in kept if job_of(r) is None] == others
    # The copy, read unfiltered, is what the whole log gives filtered.
    mine = load_file(tmp_path / "reco.jsonl")
    whole = log.loaded(selection)
    assert mine.timelines.jobs == whole.timelines.jobs
    assert mine.timelines.sessions == whole.timelines.sessions


def test_tags_and_until_pick_as_the_analysis_does(tmp_path: Path) -> None:
    log = hand_log()
    beam1 = Selection.of(tags={"beam": "1"})
    export(log.raws(), tmp_path / "beam1.jsonl", beam1)
    assert load_file(tmp_path / "beam1.jsonl").timelines.jobs == log.loaded(beam1).timelines.jobs
    assert len(log.loaded(beam1).timelines.jobs) == 2
    early = Selection.of(until=T0 + timedelta(seconds=5))  # jobs created at 0 s, not 10 or 20
    export(log.raws(), tmp_path / "early.jsonl", early)
    picked = {job_of(r) for r in copied(tmp_path / "early.jsonl")} - {None}
    assert len(picked) == 2
    assert load_file(tmp_path / "early.jsonl").timelines.jobs == log.loaded(early).timelines.jobs


def test_no_job_filter_copies_every_message_and_refusals_stay_counted(tmp_path: Path) -> None:
    log = hand_log()
    raws = [*log.raws(), GARBAGE]
    assert not JobPick.needed(Selection.of(sites=["alpha"]))
    assert export(raws, tmp_path / "all.jsonl", Selection.of(sites=["alpha"])) == len(raws)
    # A job filter drops the garbled event of an unknown job with the rest of that job.
    export(raws, tmp_path / "reco.jsonl", Selection.of(apps=["reco"]))
    assert GARBAGE.seq not in {r.seq for r in copied(tmp_path / "reco.jsonl")}


def test_a_created_the_shared_rule_refuses_is_kept_to_be_counted(tmp_path: Path) -> None:
    job = uuid.uuid4()
    forged = Raw(7, f"evt.alpha.job.{job}.created", b'{"type": "job.created", "data": 1}')
    export([forged], tmp_path / "forged.jsonl", Selection.of(apps=["reco"]))
    assert [r.seq for r in copied(tmp_path / "forged.jsonl")] == [7]
    assert load_file(tmp_path / "forged.jsonl").intake.refused == 1
