"""What the controller tells an elastic queue (``services/controller/scaler.py``), without I/O."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from lodestream.schemas.events.scaler import MAX_BACKLOG_BATCH_JOBS, scaler_id
from lodestream.services.controller.scaler import (
    BacklogRow,
    BatchRow,
    backlog_event,
    due,
    snapshot,
    stored_backlog,
)

AT = datetime(2026, 3, 1, tzinfo=UTC)


def row(requested_by: str = "site:alpha", minutes_ago: int = 0) -> BatchRow:
    return BatchRow(uuid.uuid4(), "queued", 2, 30, "debug", AT - timedelta(minutes=minutes_ago),
                    requested_by)  # fmt: skip


def test_a_snapshot_says_which_batch_jobs_the_sites_elastic_queue_requested() -> None:
    ours, users, others = row(), row("user:ada"), row("site:beta")
    data = snapshot("alpha", 40, BacklogRow(3, 1.0000000004, 30.0, 20), [ours, users, others])
    assert [(j.id, j.elastic) for j in data.batch_jobs] == [
        (ours.id, True), (users.id, False), (others.id, False),
    ]  # fmt: skip
    assert (data.as_of_seq, data.runnable_jobs, data.node_footprint) == (40, 3, 1.0)


def test_a_site_with_nothing_runnable_has_an_empty_backlog() -> None:
    data = snapshot("alpha", 7, None, [])
    assert (data.runnable_jobs, data.node_footprint, data.batch_jobs) == (0, 0.0, ())


def test_only_the_newest_batch_jobs_are_listed() -> None:
    rows = [row(minutes_ago=n) for n in range(MAX_BACKLOG_BATCH_JOBS + 5)]
    data = snapshot("alpha", 1, None, rows)
    assert [j.id for j in data.batch_jobs] == [r.id for r in rows[:MAX_BACKLOG_BATCH_JOBS]]


def test_a_backlog_is_due_when_what_a_site_decides_on_changed() -> None:
    before = snapshot("alpha", 10, BacklogRow(3, 2.0, 0.0, 0), [])
    same = snapshot("alpha", 99, BacklogRow(3, 2.0, 0.0, 0), [])
    assert due(before, None, 0)
    assert not due(same, before, 0)  # the position alone is no news
    assert due(
        snapshot(
            "alpha",
            99,
            BacklogRow(4, 2.5, 0.0, 0),
            [],
        ),
        before,
        0,
    )
    assert due(snapshot("alpha", 99, BacklogRow(3, 2.0, 0.0, 0), [row()]), before, 0)


def test_a_backlog_is_due_once_the_projector_has_passed_the_sites_newest_batch_event() -> None:
    """Even unchanged: the site's queue waits for a backlog that has seen its last requests."""
    before = snapshot("alpha", 10, BacklogRow(3, 2.0, 0.0, 0), [])
    assert not due(snapshot("alpha", 20, BacklogRow(3, 2.0, 0.0, 0), []), before, 25)  # not yet
    assert due(snapshot("alpha", 25, BacklogRow(3, 2.0, 0.0, 0), []), before, 25)
    seen = snapshot("alpha", 30, BacklogRow(3, 2.0, 0.0, 0), [])
    assert not due(snapshot("alpha", 40, BacklogRow(3, 2.0, 0.0, 0), []), seen, 25)  # said


def test_the_backlog_event_is_the_sites_and_its_id_follows_from_what_it_says() -> None:
    data = snapshot("alpha", 10, BacklogRow(3, 2.0, 0.0, 0), [])
    event = backlog_event("alpha", data)
    assert (event.site, event.aggregate_id, event.actor) == ("alpha", scaler_id("alpha"),
                                                             "controller:main")  # fmt: skip
    assert event.subject == f"evt.alpha.scaler.{scaler_id('alpha')}.backlog"
    assert backlog_event("alpha", data).id == event.id
    assert backlog_event("alpha", data.model_copy(update={"as_of_seq": 11})).id != event.id


def test_a_stored_backlog_that_cannot_be_read_is_none() -> None:
    data = snapshot("alpha", 10, None, [])
    assert stored_backlog(data.model_dump(mode="json")) == data
    assert stored_backlog(None) is None
    assert stored_backlog({"as_of_seq": "soon"}) is None
