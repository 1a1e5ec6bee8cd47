"""The simulator's hand-backs, on a workload small enough to follow by hand: a job that needs
a whole node, offered while a slot is free but no node is, goes round the pilot's
hand-back cycle instead of holding the first node that frees up, unless its pilot has
room to keep it for the next free node (launcher.prefetch), for at most 2 s."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lodestream.client.analytics.simulate.calibrate import (
    Calibration,
    hand_back_period,
    hand_back_phases,
)
from lodestream.client.analytics.simulate.engine import simulate
from lodestream.client.analytics.simulate.model import Attempt, JobTrace, PilotShape, Scenario


def one(compute: float, *, arrival: float = 0.0, units: int = 1, order: float | None = None,
        offered: float | None = None) -> JobTrace:  # fmt: skip
    attempt = Attempt(dispatch_s=0.0, overhead_s=0.0, compute_s=compute, order=order,
                      offered=offered)  # fmt: skip
    return JobTrace(site="a", app="x", num_nodes=1, arrival=arrival, prepare_s=0.0,
                    attempts=(attempt,), finish_s=0.0, units=units)  # fmt: skip


def workload(
    whole: JobTrace, *, busy_until: float = 3.0, kept: int = 0, late: float = 1.2
) -> Calibration:
    """2 nodes x 2 slots. Four one-slot jobs fill them (node 0 until 1 s and ``busy_until``,
    node 1 until ``busy_until``); ``whole`` needs a node; a one-slot job comes at ``late``
    and runs 1 s. ``kept``: jobs a full pilot keeps for its next slot (launcher.prefetch)
    while work waits behind them."""
    jobs = (one(1.0, order=0.0), one(busy_until, order=0.1), one(busy_until, order=0.2),
            one(busy_until, order=0.3), whole, one(1.0, arrival=late))  # fmt: skip
    return Calibration(jobs=jobs, pilots={"a": (PilotShape(0.0, (2, 2)),)},
                       capacity_source="test", makespan_s=1.0, storage=None, stages={},
                       hand_back_s=0.5, kept_per_pilot=kept)  # fmt: skip


def test_a_whole_node_job_goes_round_the_hand_back_cycle() -> None:
    # At 1 s a slot of node 0 frees: the whole-node job is fetched, does not fit, and is
    # handed back until 1.5 s; the job that comes at 1.2 s takes that slot. At 1.5 s no
    # slot is free: no pilot fetches, it waits. At 2.2 s a slot frees: handed back till
    # 2.7 s, when node 0 still runs until 3 s: again till 3.2 s, when it fits: ends 4.2 s.
    # Queued instead (the model before hand-backs), it took node 0 at 3 s and ended at 4 s.
    prediction = simulate(workload(one(1.0, units=2, order=0.4)), Scenario())
    assert prediction.makespan_s == pytest.approx(4.2)
    assert prediction.handed_back == 3


def test_a_recorded_hand_back_keeps_its_phase() -> None:
    # Leased in the recording at an offer at 3.1 s: its cycle offers at 1.1, 1.6, ... In
    # the replay it is handed back at 1 s (till 1.1 s, a slot is free: again till 1.6 s);
    # at 1.6 s and 2.1 s no slot is free (the 1.2 s job holds it till 2.2 s): it waits;
    # at 2.2 s it is handed back till the cycle's 2.6 s, then 3.1 s, when it fits.
    whole = one(1.0, units=2, order=0.4, offered=3.1)
    prediction = simulate(workload(whole), Scenario())
    assert prediction.makespan_s == pytest.approx(4.1)
    # Re-spaced arrivals have no recorded phase: a hand-back delay from each hand-back.
    respaced = simulate(workload(whole), Scenario(arrival_rate=1000.0))
    assert respaced.handed_back >= 1


def test_a_pilot_with_room_to_keep_it_places_it_the_moment_a_node_frees() -> None:
    # Runnable at 1 s while the pilot is full: it fetches it all the same and keeps it
    # (launcher.prefetch), not handed back: node 0 frees at 3 s, it starts then (round the
    # cycle instead, it would start at 3.2 s: see the first test).
    whole = one(1.0, arrival=1.0, units=2, order=0.4)
    prediction = simulate(workload(whole, kept=2), Scenario())
    assert prediction.makespan_s == pytest.approx(4.0)
    assert prediction.handed_back == 0


def test_a_job_kept_longer_than_its_pilot_keeps_one_is_handed_back_then() -> None:
    # Kept at 1 s (behind the job of 0.9 s, kept too and placed at 1 s); nodes busy until
    # 4 s: handed back at 3 s (kept 2 s), offered at 3.5 s (a slot is free, no node: back
    # again) and at 4 s, when the nodes free first: ends 5 s.
    whole = one(1.0, arrival=1.0, units=2, order=0.4)
    kept = simulate(workload(whole, busy_until=4.0, kept=2, late=0.9), Scenario())
    assert kept.makespan_s == pytest.approx(5.0)
    assert kept.handed_back == 2
    # Not kept: back at 1 s, queued at 1.5 s (no slot free), back at 2 s, then at 2.5, 3
    # and 3.5 s; it fits at 4 s too, after five hand-backs.
    cycled = simulate(workload(whole, busy_until=4.0, late=0.9), Scenario())
    assert cycled.makespan_s == pytest.approx(5.0)
    assert cycled.handed_back == 5


def test_with_a_node_free_it_starts_at_once() -> None:
    cal = workload(one(1.0, units=2, order=0.4))
    bigger = simulate(replace(cal, pilots={"a": (PilotShape(0.0, (2, 2, 2)),)}), Scenario())
    assert bigger.handed_back == 0
    assert bigger.makespan_s == pytest.approx(3.0)


def test_the_hand_back_period_from_leases_whole_cycles_apart() -> None:
    # Three leases of one phase, 0.504 s a cycle; a fourth 0.2 s off says nothing of it.
    offers = [10.0, 10.504, 11.512, 11.712]
    assert hand_back_period(offers) == pytest.approx(0.504)
    assert hand_back_period([10.0]) == 0.5  # nothing shows: the pilot's default
    assert hand_back_period([10.0, 10.2]) == 0.5


def test_offers_of_one_phase_come_back_together() -> None:
    # One phase, at the latest of its offers moved onto one cycle (none before its own).
    phase = hand_back_phases([10.0, 10.5005, 11.0, 10.2], 0.5)
    assert phase == pytest.approx({10.0: 10.0005, 10.5005: 10.0005, 11.0: 10.0005, 10.2: 10.2})


def test_a_kept_job_waits_for_its_own_pilot_while_another_has_room() -> None:
    # Two pilots of 2 slots; the jobs go to their fetches in turn: A runs the two 3 s jobs,
    # B the two 0.5 s ones. The fifth job comes to A, full, which keeps it (launcher.prefetch)
    # for its own next slot; B keeps the sixth and starts it at 0.5 s, then has room, but
    # the fifth is A's: handed back at 2 s (kept 2 s), offered at 2.5 s to the pilot whose
    # fetch is next, A again, which keeps it until its slots free at 3 s: it ends at 4 s.
    # Deliveries a site held for whichever pilot frees first, it would have ended at 1.5 s.
    runs = (3.0, 0.5, 3.0, 0.5, 1.0, 1.0)
    jobs = tuple(one(run, order=0.1 * k) for k, run in enumerate(runs))
    two: dict[str, tuple[PilotShape, ...]] = {"a": (PilotShape(0.0, (2,)), PilotShape(0.0, (2,)))}
    cal = Calibration(jobs=jobs, pilots=two, capacity_source="test", makespan_s=1.0,
                      storage=None, stages={}, hand_back_s=0.5, kept_per_pilot=2)  # fmt: skip
    kept = simulate(cal, Scenario())
    assert kept.makespan_s == pytest.approx(4.0)
    assert kept.handed_back == 1
    # Pilots that keep nothing fetch only with a slot free: B takes both at 0.5 s.
    assert simulate(replace(cal, kept_per_pilot=0), Scenario()).makespan_s == pytest.approx(3.0)
