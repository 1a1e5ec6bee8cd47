"""The transfer module's pure decisions (``agents/site/transfers/plan.py``) and the item
lifecycle table (``schemas/xfer.py``)."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lodestream.agents.site.transfers import plan
from lodestream.platform_adapters.transfers.base import ItemOutcome
from lodestream.schemas.errors import IllegalTransition
from lodestream.schemas.resources import TransferState
from lodestream.schemas.xfer import (
    XFER_TRANSITIONS,
    item_id,
    local_path,
    next_xfer_state,
    remote_path_problem,
)


def pending(location: str = "dtn", direction: str = "in", seq: int = 1) -> plan.PendingItem:
    return plan.PendingItem(
        item_id=uuid.uuid4(), location=location, direction=direction,  # type: ignore[arg-type]
        source="/s", destination="/d", recursive=False, attempt=1, since_seq=seq,
    )  # fmt: skip


def test_items_are_batched_by_location_and_direction_up_to_the_batch_size() -> None:
    pool = [pending("dtn", "in", seq) for seq in range(5)]
    pool += [pending("dtn", "out", 10), pending("laptop", "in", 11)]
    made = plan.batches(pool, batch_size=2, free_slots=10)
    assert sorted((b.location, b.direction, len(b.items)) for b in made) == [
        ("dtn", "in", 1), ("dtn", "in", 2), ("dtn", "in", 2), ("dtn", "out", 1),
        ("laptop", "in", 1),
    ]  # fmt: skip
    # Oldest first within a group.
    first = next(b for b in made if b.location == "dtn" and b.direction == "in")
    assert [i.since_seq for i in first.items] == [0, 1]


def test_no_more_batches_than_free_task_slots_and_full_ones_first() -> None:
    pool = [pending("a", seq=1), *(pending("b", seq=seq) for seq in range(2, 6))]
    made = plan.batches(pool, batch_size=4, free_slots=1)
    assert [(b.location, len(b.items)) for b in made] == [("b", 4)]
    assert plan.batches(pool, batch_size=4, free_slots=0) == []


@given(st.integers(1, 60), st.integers(1, 7), st.integers(1, 12))
def test_every_item_goes_in_at_most_one_batch_of_its_own_group(
    count: int, batch_size: int, free: int
) -> None:
    pool = [pending(f"loc{n % 3}", "in" if n % 2 else "out", n) for n in range(count)]
    made = plan.batches(pool, batch_size=batch_size, free_slots=free)
    placed = [i.item_id for b in made for i in b.items]
    assert len(placed) == len(set(placed))
    assert len(made) <= free
    for batch in made:
        assert 1 <= len(batch.items) <= batch_size
        assert {(i.location, i.direction) for i in batch.items} == {
            (batch.location, batch.direction)
        }
    if free >= count:  # room for all: everything is placed
        assert len(placed) == count


def test_a_backend_that_moves_items_one_by_one_gets_them_spread_over_free_slots() -> None:
    # Issue 31.9: 60 ssh items in one task while 4 of 5 task slots sat idle.
    pool = [pending("ssh", seq=seq) for seq in range(60)]
    spread = plan.batches(pool, batch_size=100, free_slots=5, spread={"ssh"})
    assert sorted(len(b.items) for b in spread) == [7, 8, 15, 15, 15]
    assert len({i.item_id for b in spread for i in b.items}) == 60
    # A backend with a fixed cost per task (Globus) keeps its one batch.
    assert [len(b.items) for b in plan.batches(pool, batch_size=100, free_slots=5)] == [60]


@given(st.integers(1, 60), st.integers(1, 7), st.integers(1, 12))
def test_spreading_places_the_same_items_in_no_more_slots(
    count: int, batch_size: int, free: int
) -> None:
    pool = [pending(f"loc{n % 2}", "in", n) for n in range(count)]
    batched = plan.batches(pool, batch_size=batch_size, free_slots=free)
    spread = plan.batches(pool, batch_size=batch_size, free_slots=free, spread={"loc0"})
    assert {i.item_id for b in spread for i in b.items} == {
        i.item_id for b in batched for i in b.items
    }
    assert len(batched) <= len(spread) <= free
    assert all(len(b.items) >= 1 for b in spread)


def test_items_under_different_policies_go_in_different_tasks() -> None:
    never, always = pending(seq=1), replace(pending(seq=2), overwrite="always")
    checked = replace(pending(seq=3), sha256="0" * 64)
    made = plan.batches([never, always, checked], batch_size=10, free_slots=10)
    assert sorted(len(b.items) for b in made) == [1, 1, 1]
    item = made[0].to_request("rsync:/x").items[0]
    assert (item.overwrite, item.verify) in {("never", False), ("always", False)}


def test_a_submission_key_is_the_same_for_the_same_items_at_the_same_attempts() -> None:
    a, b = pending(), pending()
    one = plan.Batch("dtn", "in", (a, b))
    assert one.submission_key == plan.Batch("dtn", "in", (b, a)).submission_key
    retried = plan.Batch("dtn", "in", (b, replace(a, attempt=2)))
    assert retried.submission_key != one.submission_key
    assert one.submission_key.startswith("lode-")


@pytest.mark.parametrize(
    ("result", "attempt", "expected"),
    [
        (ItemOutcome(ok=True, bytes_transferred=3), 1, plan.Decision("succeeded")),
        (ItemOutcome(ok=False, reason="No such file", permanent=True), 1,
         plan.Decision("failed", "No such file", permanent=True)),
        (ItemOutcome(ok=False, reason="connection reset"), 1,
         plan.Decision("retry", "connection reset")),
        (ItemOutcome(ok=False, reason="connection reset"), 3,
         plan.Decision("retry", "connection reset")),
        (ItemOutcome(ok=False, reason="connection reset"), 4,
         plan.Decision("failed", "connection reset (after 4 attempts)")),
        (ItemOutcome(ok=False), 1,
         plan.Decision("retry", "the transfer backend reported a failure without a reason")),
    ],
)  # fmt: skip
def test_an_items_outcome_is_success_another_attempt_or_failure(
    result: ItemOutcome, attempt: int, expected: plan.Decision
) -> None:
    assert plan.outcome(result, attempt=attempt, retry_budget=3) == expected


def test_items_a_final_task_said_nothing_about_are_missing() -> None:
    ids = [uuid.uuid4(), uuid.uuid4()]
    assert plan.missing_items(ids, [str(ids[0])]) == [ids[1]]


def test_the_item_lifecycle_allows_exactly_its_table() -> None:
    states: list[TransferState | None] = [None, *TransferState]
    allowed = {
        ("xfer.requested", None), ("xfer.submitted", TransferState.PENDING),
        ("xfer.submitted", TransferState.SUBMITTED), ("xfer.succeeded", TransferState.SUBMITTED),
        ("xfer.succeeded", TransferState.PENDING),  # served from the site's stage cache
        ("xfer.failed", TransferState.PENDING), ("xfer.failed", TransferState.SUBMITTED),
    }  # fmt: skip
    for event_type in XFER_TRANSITIONS:
        for state in states:
            if (event_type, state) in allowed:
                next_xfer_state(state, event_type)
            else:
                with pytest.raises(IllegalTransition):
                    next_xfer_state(state, event_type)
    with pytest.raises(IllegalTransition, match="not a transfer-item event"):
        next_xfer_state(None, "job.started")


def test_item_ids_belong_to_their_step() -> None:
    job, step, other = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    assert item_id(step, job, "inputs", "in") == item_id(step, job, "inputs", "in")
    assert item_id(step, job, "inputs", "in") != item_id(other, job, "inputs", "in")
    assert item_id(step, job, "inputs", "in") != item_id(step, job, "inputs", "out")


@pytest.mark.parametrize("bad", ["/etc/passwd", "../up", "a/../../b", "", "/"])
def test_a_slot_path_may_not_leave_the_jobs_directory(bad: str) -> None:
    with pytest.raises(ValueError, match="must be relative"):
        local_path("runs/1", bad)
    assert local_path("runs/1", "in/data.h5") == "runs/1/in/data.h5"


def test_an_item_marked_alone_goes_in_a_batch_of_its_own() -> None:
    pool = [pending(seq=seq) for seq in range(4)]
    pool[1] = replace(pool[1], alone=True)
    pool[2] = replace(pool[2], alone=True)
    made = plan.batches(pool, batch_size=8, free_slots=10)
    assert sorted(len(b.items) for b in made) == [1, 1, 2]
    assert {b.items[0].item_id for b in made if len(b.items) == 1} == {
        pool[1].item_id,
        pool[2].item_id,
    }
    assert len({b.submission_key for b in made}) == 3


@pytest.mark.parametrize(
    "path", ["/", "/data/in.h5", "/a/../b", "/a/./b/", "//x", "/a/b/../../c", "/[run 1].json"]
)
def test_a_remote_path_every_backend_can_move_passes_the_shared_rule(path: str) -> None:
    assert remote_path_problem(path) is None


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("p/typo.txt", "not an absolute path"),
        ("", "not an absolute path"),
        ("./in.h5", "not an absolute path"),
        ("/..", "climbs out"),
        ("/a/../../etc/passwd", "climbs out"),
        ("/./../x", "climbs out"),
        ("/in\nput", "control character"),
        ("/in\x00put", "control character"),
        ("/tab\there", "control character"),
    ],
)
def test_the_shared_rule_refuses_what_no_backend_can_move(path: str, words: str) -> None:
    problem = remote_path_problem(path)
    assert problem is not None
    assert words in problem
    assert repr(path) in problem
