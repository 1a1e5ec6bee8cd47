"""The what-if model's elastic queue: recorded decisions decided again under other limits.

Each expectation is worked out by hand from the policy's rules (requests of at most
``max_nodes`` until the deficit is covered, ``max_queued_jobs`` waiting at most, a batch
job waiting longer than ``max_queue_wait_min`` deleted and its nodes no longer counted).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from lodestream.agents.site.elastic import record
from lodestream.agents.site.elastic.policy import plan
from lodestream.client.analytics.simulate.elastic import ScalerReplay, replay_scaler
from lodestream.client.analytics.simulate.errors import BadScenario
from lodestream.schemas.events.scaler import (
    ScalerBacklog,
    ScalerBacklogData,
    ScalerDecided,
    ScalerLimits,
    scaler_id,
)
from tests.unit.test_elastic_policy import NOW, SITE, backlog, batch, limits


def recorded(data: ScalerBacklogData, lim: ScalerLimits, minutes: int) -> ScalerDecided:
    """What the site's scaler wrote on deciding ``data`` under ``lim``."""
    now = NOW + timedelta(minutes=minutes)
    event = ScalerBacklog.create(
        site=SITE, aggregate_id=scaler_id(SITE), actor="controller:main", data=data
    )
    return record.decided(
        SITE, plan(data, None, lim, now), backlog=event, windows=None, limits=lim, now=now
    )


@pytest.fixture
def decisions() -> list[ScalerDecided]:
    lim = limits()  # max_nodes 4, max_queued_jobs 3, no max_queue_wait_min
    return [
        recorded(backlog(10), lim, 0),  # 10 short: 4 + 4 + 2
        # 2 needed, 1 queued for 90 min covers one: 1 short, one 1-node job
        recorded(backlog(2, 2, 0, batch("queued", 1, waited_min=90)), lim, 0),
    ]


def test_the_recorded_limits_decide_what_was_recorded(decisions: list[ScalerDecided]) -> None:
    assert replay_scaler(decisions, {}) == ScalerReplay(
        decisions=2,
        recorded_jobs=4, recorded_nodes=11,
        replayed_jobs=4, replayed_nodes=11,
        recorded_deletions=0, replayed_deletions=0,
    )  # fmt: skip


def test_larger_batch_jobs_cover_the_same_backlog_in_fewer(
    decisions: list[ScalerDecided],
) -> None:
    again = replay_scaler(decisions, {"max_nodes": 8})
    # 10 short: 8 + 2; then 1 short: 1
    assert (again.replayed_jobs, again.replayed_nodes) == (3, 11)
    assert (again.recorded_jobs, again.recorded_nodes) == (4, 11)


def test_a_queue_wait_limit_deletes_the_stale_job_and_asks_for_its_nodes(
    decisions: list[ScalerDecided],
) -> None:
    again = replay_scaler(decisions, {"max_queue_wait_min": 60})
    # the first decision as recorded; the second deletes the 90-minute job, 2 short: one of 2
    assert (again.replayed_jobs, again.replayed_nodes) == (4, 12)
    assert (again.recorded_deletions, again.replayed_deletions) == (0, 1)


def test_fewer_queued_jobs_allowed_ask_for_less(decisions: list[ScalerDecided]) -> None:
    again = replay_scaler(decisions, {"max_queued_jobs": 1})
    # one job of 4 for the first; the second already has 1 waiting, so nothing
    assert (again.replayed_jobs, again.replayed_nodes) == (1, 4)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"min_nodes": 9}, r"min_nodes \(9\) is more than max_nodes \(4\)"),
        ({"max_nodes": 0}, "greater than or equal to 1"),
        ({"max_nodez": 8}, "elastic queue settings"),
    ],
)
def test_bad_settings_are_refused_clearly(
    decisions: list[ScalerDecided], changes: dict[str, object], message: str
) -> None:
    with pytest.raises(BadScenario, match=message):
        replay_scaler(decisions, changes)


def test_no_recorded_decision_replays_to_nothing() -> None:
    assert replay_scaler([], {"max_nodes": 8}) == ScalerReplay(0, 0, 0, 0, 0, 0, 0)
