"""The live views' state rule (``state_after``, and its port ``ui/fold.js``) is the fold's.

Every event the fold accepts, from every state, with every chain of up to three skipped
steps, must lead ``state_after`` to the state :func:`~lodestream.schemas.fold.apply`
reaches; the dashboard's JavaScript is run under node on the same cases.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
from importlib import resources
from pathlib import Path
from typing import Final

import pytest

from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import IllegalTransition
from lodestream.schemas.events.job import CreatedData, JobCreated
from lodestream.schemas.fold import apply, skipped_steps, state_after, steps_of
from lodestream.schemas.states import SKIPPABLE, TRANSITIONS, JobState
from lodestream.services.api.dashboard import TARGETS
from tests.unit.test_state_machine import AT, JOB_ID, SEQ, SITE, job_event, view_in

MAX_SKIPPED: Final = 3

Case = tuple[str | None, bool, str, tuple[str, ...], str]
"""(state before or None, leased, event type, skipped, state after)"""


def _accepted() -> list[Case]:
    chains = [
        chain
        for n in range(MAX_SKIPPED + 1)
        for chain in itertools.permutations(sorted(SKIPPABLE), n)
    ]
    cases: list[Case] = []
    for event_type in TRANSITIONS:
        for skipped in chains:
            event = _event(event_type, skipped)
            if skipped_steps(event) != skipped:
                continue  # this payload has no skipped field
            starts: list[tuple[JobState | None, bool]] = []
            if event_type == "job.created":
                starts.append((None, False))
            starts += [(s, leased) for s in JobState for leased in (False, True)]
            for state, leased in starts:
                before = None if state is None else view_in(state, leased=leased)
                try:
                    after = apply(before, event, SEQ)
                except IllegalTransition:
                    continue
                cases.append((state, leased, event_type, skipped, after.state.value))
    return cases


def _event(event_type: str, skipped: tuple[str, ...]) -> Event:
    if event_type != "job.created":
        return job_event(event_type, skipped=skipped)
    data = CreatedData(site=SITE, app="demo", workdir="demo/1", skipped=skipped)
    return JobCreated.create(
        site=SITE, aggregate_id=JOB_ID, actor="user:test", data=data, occurred_at=AT
    )


CASES: Final = _accepted()


def test_the_cases_cover_every_event_type_and_skip() -> None:
    assert {c[2] for c in CASES} == set(TRANSITIONS)
    assert {step for c in CASES for step in c[3]} == SKIPPABLE
    created_runnable = [c for c in CASES if c[2] == "job.created" and c[3]]
    assert created_runnable, "a job created runnable is among the cases"
    assert all(c[4] == JobState.PREPROCESSED for c in created_runnable)


def test_state_after_reaches_the_folds_state_on_every_accepted_event() -> None:
    wrong = [
        c
        for c in CASES
        if state_after(None if c[0] is None else JobState(c[0]), c[2], c[3]) != c[4]
    ]
    assert not wrong, wrong[:5]


def test_a_lease_event_of_a_job_not_seen_before_leaves_the_state_unknown() -> None:
    assert state_after(None, "job.leased") is None
    assert state_after(None, "session.opened") is None
    assert state_after(JobState.PREPROCESSED, "job.lease_expired") == JobState.PREPROCESSED


def test_steps_follow_a_creation_and_precede_any_other_event() -> None:
    assert steps_of("job.created", ("job.ready",)) == ("job.created", "job.ready")
    assert steps_of("job.started", ("job.leased",)) == ("job.leased", "job.started")


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_dashboards_port_reaches_the_same_states(tmp_path: Path) -> None:
    fold_js = resources.files("lodestream.services.api").joinpath("ui", "fold.js")
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps({"targets": TARGETS, "cases": CASES}))
    script = f"""
const {{ stateAfter }} = require({json.dumps(str(fold_js))});
const {{ targets, cases }} = JSON.parse(require("fs").readFileSync({json.dumps(str(cases))}));
const wrong = cases.filter(([state, , type, skipped, after]) =>
  stateAfter(targets, state, type, skipped) !== after);
console.log(JSON.stringify({{ checked: cases.length, wrong: wrong.slice(0, 5) }}));
"""
    out = subprocess.run(["node", "-e", script], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    assert result == {"checked": len(CASES), "wrong": []}
