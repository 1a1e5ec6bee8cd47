"""The elastic queue's policy: examples of each rule, then properties over arbitrary inputs."""

from __future__ import annotations

import math
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from lodestream.agents.site.elastic import record
from lodestream.agents.site.elastic.policy import WAITING, Plan, deficit, plan
from lodestream.agents.site.settings import ElasticSettings
from lodestream.schemas.events.scaler import (
    ScalerBacklog,
    ScalerBacklogData,
    ScalerBatchJob,
    ScalerLimits,
    WindowData,
    scaler_id,
)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SITE = "alpha"


def limits(**changes: Any) -> ScalerLimits:
    base: dict[str, Any] = {
        "queue": "debug", "project": "proj", "min_nodes": 1, "max_nodes": 4,
        "min_wall_time_min": 20, "max_wall_time_min": 60, "wall_time_pad_min": 5,
        "max_queued_jobs": 3,
    }  # fmt: skip
    return ScalerLimits(**(base | changes))


def batch(
    state: str = "queued", nodes: int = 1, *, waited_min: float = 1, elastic: bool = True
) -> ScalerBatchJob:
    return ScalerBatchJob(
        id=uuid.uuid4(), state=state, num_nodes=nodes, wall_time_min=30, queue="debug",
        requested_at=NOW - timedelta(minutes=waited_min), elastic=elastic,
    )  # fmt: skip


def backlog(
    footprint: float = 0, jobs: int | None = None, wall: int = 0, *batch_jobs: ScalerBatchJob
) -> ScalerBacklogData:
    count = jobs if jobs is not None else math.ceil(footprint)
    return ScalerBacklogData(
        as_of_seq=10, runnable_jobs=count, node_footprint=footprint, max_wall_time_min=wall,
        batch_jobs=batch_jobs,
    )  # fmt: skip


def shapes(result: Plan) -> list[tuple[int, int]]:
    return [(p.request.num_nodes, p.request.wall_time_min) for p in result.requests]


# --- examples ----------------------------------------------------------------------------


def test_no_backlog_yet_requests_nothing() -> None:
    result = plan(None, None, limits(), NOW)
    assert not result.acts
    assert result.reason == "no backlog from the control plane yet"


def test_nothing_runnable_requests_nothing() -> None:
    result = plan(backlog(0), None, limits(), NOW)
    assert not result.acts
    assert result.reason == "nothing runnable"


def test_a_deficit_is_requested_in_jobs_of_at_most_max_nodes() -> None:
    result = plan(backlog(10, wall=25), None, limits(), NOW)
    assert shapes(result) == [(4, 30), (4, 30), (2, 30)]  # wall: 25 + 5 pad
    request = result.requests[0].request
    assert (request.queue, request.project, request.job_mode) == ("debug", "proj", "mpi")
    assert result.requests[0].window is None


def test_a_small_deficit_is_raised_to_min_nodes_and_wall_time_is_clamped() -> None:
    assert shapes(plan(backlog(0.5, jobs=2), None, limits(min_nodes=2), NOW)) == [(2, 20)]
    assert shapes(plan(backlog(1, wall=600), None, limits(), NOW)) == [(1, 60)]


def test_node_packing_shares_nodes() -> None:
    # 8 single-node jobs that pack 4 to a node need 2 nodes, not 8
    assert shapes(plan(backlog(2.0, jobs=8), None, limits(), NOW)) == [(2, 20)]


def test_what_is_queued_or_running_covers_the_backlog() -> None:
    covered = backlog(5, 5, 0, batch("running", 3), batch("queued", 2))
    result = plan(covered, None, limits(), NOW)
    assert not result.acts
    assert "covered by 5 node(s)" in result.reason
    assert (result.queued, result.running) == (1, 1)
    partly = backlog(7, 7, 0, batch("running", 3), batch("requested", 2))
    assert shapes(plan(partly, None, limits(), NOW)) == [(2, 20)]


def test_a_users_batch_jobs_cover_the_backlog_too() -> None:
    result = plan(backlog(2, 2, 0, batch("queued", 2, elastic=False)), None, limits(), NOW)
    assert not result.acts


def test_max_queued_jobs_is_respected() -> None:
    full = backlog(20, 20, 0, batch("queued"), batch("submitted"), batch("requested"))
    result = plan(full, None, limits(max_queued_jobs=3), NOW)
    assert not result.acts
    assert "max_queued_jobs is 3" in result.reason
    one_slot = backlog(20, 20, 0, batch("queued"), batch("running"), batch("running"))
    assert len(plan(one_slot, None, limits(max_queued_jobs=2), NOW).requests) == 1


def test_backfill_fits_the_request_into_the_best_window() -> None:
    windows = [
        WindowData(queue="debug", nodes=2, minutes=90),
        WindowData(queue="debug", nodes=6, minutes=30),
        WindowData(queue="other", nodes=100, minutes=None),
    ]
    result = plan(backlog(10, wall=50), windows, limits(use_backfill=True), NOW)
    # 4 nodes (max_nodes) fit the 6-node window; 30 min less the pad leaves 25 of the 55 wanted
    assert shapes(result) == [(4, 25)]
    assert result.requests[0].window == windows[1]


def test_backfill_prefers_the_longer_window_when_nodes_tie() -> None:
    windows = [
        WindowData(queue="debug", nodes=2, minutes=90),
        WindowData(queue="debug", nodes=2, minutes=40),
    ]
    result = plan(backlog(2, wall=50), windows, limits(use_backfill=True), NOW)
    assert shapes(result) == [(2, 55)]
    assert result.requests[0].window == windows[0]


def test_backfill_with_an_unlimited_window_asks_for_what_the_jobs_need() -> None:
    windows = [WindowData(queue="debug", nodes=8, minutes=None)]
    assert shapes(plan(backlog(3, wall=10), windows, limits(use_backfill=True), NOW)) == [(3, 20)]


def test_backfill_requests_nothing_when_no_window_fits() -> None:
    windows = [
        WindowData(queue="debug", nodes=1, minutes=600),  # fewer nodes than min_nodes
        WindowData(queue="debug", nodes=8, minutes=24),  # 24 - 5 pad < 20 min
        WindowData(queue="other", nodes=8, minutes=600),  # another queue
    ]
    result = plan(backlog(10), windows, limits(use_backfill=True, min_nodes=2), NOW)
    assert not result.acts
    assert result.reason.startswith("no backfill window of queue 'debug'")
    assert not plan(backlog(10), [], limits(use_backfill=True), NOW).acts


def test_batch_jobs_waiting_too_long_are_deleted_and_replaced() -> None:
    old = batch("queued", 4, waited_min=31)
    young = batch("queued", 4, waited_min=29)
    running = batch("running", 4, waited_min=300)
    users = batch("queued", 4, waited_min=300, elastic=False)
    result = plan(backlog(20, 20, 0, old, young, running, users), None,
                  limits(max_queue_wait_min=30, max_queued_jobs=3), NOW)  # fmt: skip
    assert [d.batch_job_id for d in result.deletions] == [old.id]
    assert "queued for 31 min, over max_queue_wait_min (30)" in result.deletions[0].reason
    # the deleted job covers nothing any more, and frees a queue slot: 20 - 12 = 8 nodes
    assert shapes(result) == [(4, 20)]
    assert result.reason.startswith("deleting 1 batch job(s) waiting over 30 min; ")
    assert (result.queued, result.running) == (3, 1)


def test_without_max_queue_wait_nothing_is_deleted() -> None:
    ancient = batch("queued", waited_min=10_000)
    assert plan(backlog(5, 5, 0, ancient), None, limits(), NOW).deletions == ()


def test_the_deficit_counts_every_open_batch_job() -> None:
    assert deficit(backlog(5.0000001, 9), [batch("queued", 2)]) == 3
    assert deficit(backlog(0.0), []) == 0


# --- settings ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"min_nodes": 5, "max_nodes": 2}, "min_nodes (5) is more than max_nodes (2)"),
        ({"min_wall_time_min": 90, "max_wall_time_min": 60}, "min_wall_time_min (90) is more"),
        ({"use_backfill": True, "queue": ""}, "use_backfill needs a queue"),
        ({"queue": "-x"}, "String should match pattern"),
        ({"project": "a b"}, "String should match pattern"),
        ({"max_queued_jobs": 0}, "greater than or equal to 1"),
        ({"period_s": 0}, "greater than or equal to 1"),
        ({"job_mode": "batch"}, "'serial' or 'mpi'"),
        ({"max_queue_wait": 10}, "Extra inputs are not permitted"),
    ],
)
def test_elastic_settings_are_validated_with_clear_errors(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        ElasticSettings(**changes)


def test_elastic_queue_is_off_by_default_and_limits_leave_out_the_loop_settings() -> None:
    default = ElasticSettings()
    assert not default.enabled
    configured = ElasticSettings(enabled=True, period_s=5, queue="q", max_nodes=8)
    assert configured.limits == ScalerLimits(queue="q", max_nodes=8)


# --- properties --------------------------------------------------------------------------

WALLS = st.integers(1, 600)


@st.composite
def limit_sets(draw: st.DrawFn) -> ScalerLimits:
    min_nodes = draw(st.integers(1, 16))
    min_wall = draw(WALLS)
    return ScalerLimits(
        queue=draw(st.sampled_from(["debug", "prod"])),
        project=draw(st.sampled_from(["", "p"])),
        job_mode=draw(st.sampled_from(["serial", "mpi"])),
        min_nodes=min_nodes,
        max_nodes=draw(st.integers(min_nodes, 64)),
        min_wall_time_min=min_wall,
        max_wall_time_min=draw(st.integers(min_wall, 1200)),
        wall_time_pad_min=draw(st.integers(0, 30)),
        max_queued_jobs=draw(st.integers(1, 6)),
        max_queue_wait_min=draw(st.none() | st.integers(1, 120)),
        use_backfill=draw(st.booleans()),
    )


BATCH_JOBS = st.builds(
    ScalerBatchJob,
    id=st.uuids(),
    state=st.sampled_from(["requested", "submitted", "queued", "running"]),
    num_nodes=st.integers(1, 32),
    wall_time_min=WALLS,
    queue=st.just("debug"),
    requested_at=st.integers(0, 600).map(lambda m: NOW - timedelta(minutes=m)),
    elastic=st.booleans(),
)
BACKLOGS = st.builds(
    ScalerBacklogData,
    as_of_seq=st.integers(0, 10**6),
    runnable_jobs=st.integers(0, 10_000),
    node_footprint=st.floats(0, 500, allow_nan=False, allow_infinity=False),
    max_wall_time_min=st.integers(0, 2000),
    batch_jobs=st.lists(BATCH_JOBS, max_size=8, unique_by=lambda j: j.id).map(tuple),
)
WINDOWS = st.lists(
    st.builds(
        WindowData,
        queue=st.sampled_from(["debug", "prod"]),
        nodes=st.integers(0, 64),
        minutes=st.none() | st.integers(0, 1500),
    ),
    max_size=5,
).map(tuple)


@given(BACKLOGS, WINDOWS, limit_sets())
@settings(max_examples=400, deadline=None)
def test_every_request_respects_the_limits(
    data: ScalerBacklogData, windows: tuple[WindowData, ...], lim: ScalerLimits
) -> None:
    result = plan(data, windows if lim.use_backfill else None, lim, NOW)
    deleted = {d.batch_job_id for d in result.deletions}
    kept = [j for j in data.batch_jobs if j.id not in deleted]
    waiting = sum(1 for j in kept if j.state in WAITING)
    assert len(result.requests) <= max(0, lim.max_queued_jobs - waiting)
    missing = deficit(data, kept)
    if missing <= 0:
        assert not result.requests  # covered, or nothing runnable: nothing more is asked
    else:
        # never more than one job's worth beyond the deficit
        assert sum(p.request.num_nodes for p in result.requests) < missing + lim.max_nodes
    for planned in result.requests:
        request = planned.request
        assert lim.min_nodes <= request.num_nodes <= lim.max_nodes
        assert lim.min_wall_time_min <= request.wall_time_min <= lim.max_wall_time_min
        assert (request.queue, request.project, request.job_mode) == (
            lim.queue, lim.project, lim.job_mode,
        )  # fmt: skip
        if lim.use_backfill:
            window = planned.window
            assert window is not None
            assert window in windows
            assert window.queue == lim.queue
            assert request.num_nodes <= window.nodes
            if window.minutes is not None:
                assert request.wall_time_min <= window.minutes - lim.wall_time_pad_min
        else:
            assert planned.window is None
    if lim.use_backfill:
        assert len(result.requests) <= 1


@given(BACKLOGS, limit_sets())
@settings(max_examples=300, deadline=None)
def test_exactly_the_elastic_jobs_waiting_too_long_are_deleted(
    data: ScalerBacklogData, lim: ScalerLimits
) -> None:
    result = plan(data, () if lim.use_backfill else None, lim, NOW)
    expected = {
        j.id
        for j in data.batch_jobs
        if lim.max_queue_wait_min is not None
        and j.elastic
        and j.state in WAITING
        and NOW - j.requested_at > timedelta(minutes=lim.max_queue_wait_min)
    }
    assert {d.batch_job_id for d in result.deletions} == expected


@given(BACKLOGS, WINDOWS, limit_sets())
@settings(max_examples=200, deadline=None)
def test_the_same_inputs_make_the_same_decision_in_any_window_order(
    data: ScalerBacklogData, windows: tuple[WindowData, ...], lim: ScalerLimits
) -> None:
    asked = windows if lim.use_backfill else None
    first = plan(data, asked, lim, NOW)
    assert plan(data, asked, lim, NOW) == first
    if asked is not None:
        assert plan(data, tuple(reversed(asked)), lim, NOW) == first


@given(BACKLOGS, WINDOWS, limit_sets())
@settings(max_examples=200, deadline=None)
def test_a_recorded_decision_replays_to_itself(
    data: ScalerBacklogData, windows: tuple[WindowData, ...], lim: ScalerLimits
) -> None:
    asked = windows if lim.use_backfill else None
    result = plan(data, asked, lim, NOW)
    backlog_event = ScalerBacklog.create(
        site=SITE, aggregate_id=scaler_id(SITE), actor="controller:main", data=data
    )
    decided = record.decided(
        SITE, result, backlog=backlog_event, windows=asked, limits=lim, now=NOW
    )
    assert record.replay(decided) == result
    effects = record.effects(decided)
    assert len(effects) == len(result.requests) + len(result.deletions)
    assert record.effects(decided) == effects  # the same events, ids included, every time
