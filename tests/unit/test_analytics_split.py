"""A replay split by aggregate: which share a subject goes to, and the merge of the shares.

Here the shares are replayed in this process (the processes and their transport are
``tests/integration/test_analytics_parallel.py``'s): what they fold, merged, must be exactly
what one replay of the whole log folds, whatever the number of shares and the selection.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import subprocess
import sys
import uuid
from datetime import timedelta

import pytest

from lodestream.client.analytics.errors import NothingSelected
from lodestream.client.analytics.intake import Raw
from lodestream.client.analytics.jsonout import summary_json
from lodestream.client.analytics.parallel.compact import pack, unpack
from lodestream.client.analytics.parallel.merge import merge_parts
from lodestream.client.analytics.parallel.partition import share_of, split_wires, wire_share_of
from lodestream.client.analytics.pilot_times import PilotStamps
from lodestream.client.analytics.replay import Replay
from lodestream.client.analytics.selection import Selection
from lodestream.client.analytics.summary import Loaded, summarize
from lodestream.client.analytics.timeline import FailureRecord, JobTimeline, RunRecord, StateEntry
from tests.support.analytics import T0, varied_log

OTHER_KINDS = ("site", "app", "xfer", "scaler")


def replayed(raws: list[Raw], selection: Selection) -> Loaded:
    replay = Replay(selection)
    replay.take(raws)
    return replay.loaded()


def in_share(subject: bytes, share: int, shares: int) -> bool:
    """The reference the reader's dealing is held to: a message goes by its subject alone."""
    return wire_share_of(subject, shares) == share


def split_replayed(raws: list[Raw], selection: Selection, shares: int) -> Loaded:
    parts = []
    for share in range(shares):
        mine = [raw for raw in raws if in_share(raw.subject.encode(), share, shares)]
        parts.append(replayed(mine, selection))
    return merge_parts(parts, selection)


def assert_same(split: Loaded, whole: Loaded) -> None:
    assert split == whole
    # Equal dicts may differ in order; the figures add floats in it.
    for name in ("jobs", "sessions", "batches"):
        assert list(getattr(split.timelines, name)) == list(getattr(whole.timelines, name))
    assert split.intake.listed == whole.intake.listed
    try:
        expected = json.dumps(summary_json(summarize(whole)))
    except NothingSelected as exc:
        words = str(exc)
    else:
        assert json.dumps(summary_json(summarize(split))) == expected
        return
    with pytest.raises(NothingSelected) as raised:
        summarize(split)
    assert str(raised.value) == words


def test_every_event_of_an_aggregate_goes_to_one_share() -> None:
    raws = varied_log()
    for shares in (1, 2, 3, 5):
        seen: dict[str, set[int]] = {}
        for raw in raws:
            parts = raw.subject.split(".")
            seen.setdefault(parts[3], set()).add(share_of(raw.subject, shares))
        assert all(len(found) == 1 for found in seen.values())
        assert set().union(*seen.values()) <= set(range(shares))


def test_events_of_other_kinds_and_nonsense_subjects_go_to_share_0() -> None:
    some = uuid.uuid4()
    for kind in OTHER_KINDS:
        assert {share_of(f"evt.alpha.{kind}.{some}.x", n) for n in (2, 3, 7)} == {0}
    for subject in ("evt.alpha.job.not-a-uuid.created", "evt.alpha.job", "", "hb.alpha.x",
                    f"evt.alpha.job.{some}"):  # fmt: skip
        assert share_of(subject, 4) == 0


def test_the_share_is_the_aggregate_ids_value_modulo_the_shares() -> None:
    ids = [uuid.uuid4() for _ in range(400)]
    for shares in (2, 3):
        got = [share_of(f"evt.beta.session.{i}.opened", shares) for i in ids]
        assert got == [i.int % shares for i in ids]
        assert set(got) == set(range(shares))  # 400 random ids reach every share


def test_the_share_is_the_same_in_another_process() -> None:
    # Not Python's hash(): a string's is salted per process.
    subjects = [raw.subject for raw in varied_log()]
    code = ("import json, sys\nfrom lodestream.client.analytics.parallel import share_of\n"
            "print(json.dumps([share_of(s, 3) for s in json.load(sys.stdin)]))")  # fmt: skip
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    run = subprocess.run([sys.executable, "-c", code], input=json.dumps(subjects), env=env,
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert json.loads(run.stdout) == [share_of(s, 3) for s in subjects]


@pytest.mark.parametrize("shares", [2, 3, 4])
def test_the_merged_shares_are_the_whole_replay(shares: int) -> None:
    raws = varied_log()
    whole = replayed(raws, Selection())
    # What the log holds, so that the comparison is of something: every kind of record.
    assert (len(whole.timelines.jobs), len(whole.timelines.sessions)) == (13, 2)
    assert (whole.intake.refused, whole.intake.illegal, len(whole.intake.listed)) == (121, 1, 100)
    assert (whole.timelines.counts.begun_before, whole.timelines.counts.other) == (1, 1)
    split = split_replayed(raws, Selection(), shares)
    assert_same(split, whole)
    assert {share_of(r.subject, shares) for r in raws} == set(range(shares))


@pytest.mark.parametrize(
    "selection",
    [
        Selection.of(sites=["beta"]),
        Selection.of(apps=["sim"], tags={"run": "1"}),
        Selection.of(since=T0 + timedelta(seconds=6), until=T0 + timedelta(seconds=9)),
        Selection.of(since_seq=30),  # jobs and pilots begun before it
        Selection.of(apps=["nothing-by-this-name"]),  # a filter that matches nothing
        Selection.of(since_seq=10_000),  # past the end: nothing read at all
    ],
)
def test_the_merge_is_exact_under_any_selection(selection: Selection) -> None:
    raws = [raw for raw in varied_log() if raw.seq >= (selection.since_seq or 1)]
    assert_same(split_replayed(raws, selection, 3), replayed(raws, selection))


def test_the_reader_hands_each_share_the_messages_of_its_subjects() -> None:
    # As the wire gives them: subject, reply, body, headers (the last two are not looked at).
    wires = [(raw.subject.encode(), b"$JS.ACK.reply", raw.data, None) for raw in varied_log()]
    for shares in (1, 2, 3):
        parts = split_wires(wires, shares)
        assert len(parts) == shares
        for share, part in enumerate(parts):
            assert part == [wire for wire in wires if in_share(wire[0], share, shares)]


def test_a_packed_part_is_rebuilt_as_it_was_replayed() -> None:
    whole = replayed(varied_log(), Selection())
    runs = [run for job in whole.timelines.jobs.values() for run in job.runs]
    # What the log holds, so that the comparison is of something; and a pilot's stamps.
    assert all(run.session_id is not None for run in runs)
    assert any(job.failures for job in whole.timelines.jobs.values())
    runs[0].stamps = PilotStamps(1.5, 2.25, 3.125, 40.0, 4242)
    back = unpack(pickle.loads(pickle.dumps(pack(whole))))
    assert_same(back, whole)
    for job in back.timelines.jobs.values():  # the same kinds of object, not just equal values
        assert all(type(entry) is StateEntry for entry in job.entries)
        assert all(type(run.stamps) is PilotStamps for run in job.runs)


def test_packing_knows_every_field_of_a_timeline() -> None:
    # A field added to one of these must be packed too (compact.py): this says so.
    names = {cls: [f.name for f in dataclasses.fields(cls)]
             for cls in (JobTimeline, RunRecord, FailureRecord)}  # fmt: skip
    assert names[JobTimeline] == [
        "job_id", "site", "app", "tags", "num_nodes", "ranks", "node_packing_count",
        "wall_time_min", "created_at", "created_seq", "state", "attempt", "entries", "runs",
        "failures", "pending_lease_at",
    ]  # fmt: skip
    assert names[RunRecord] == [
        "attempt", "session_id", "started_at", "started_seq", "lease_event_at", "stamps",
        "ended_at", "outcome", "reported_by_pilot", "return_code", "runtime_s", "slots",
    ]  # fmt: skip
    assert names[FailureRecord] == [
        "seq", "at", "type", "attempt", "reason", "cause", "return_code", "stderr_tail",
        "stderr_first",
    ]  # fmt: skip
    assert StateEntry._fields == ("state", "at", "seq", "attempt")
