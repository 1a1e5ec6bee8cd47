"""The analytics pause the cyclic collector only because they make no reference cycles.

A replay and the figures run with the collector paused (:mod:`lodestream.collector`); were
a cycle made there, it would stay in memory until the collector runs
again. Here a replay of the hand-computed log, with refusals and an illegal transition, and
its figures make nothing the collector would find, and the pause leaves the collector as
it found it.
"""

from __future__ import annotations

import gc

from lodestream.client.analytics.intake import Raw
from lodestream.client.analytics.summary import summarize
from lodestream.collector import collector_paused
from tests.support.analytics import hand_log


def test_a_replay_and_its_figures_leave_nothing_to_collect(collector: None) -> None:
    log = hand_log()
    first = log.raws()[0]  # batch.requested: again, an illegal transition
    bad = [Raw(900, first.subject, b"{oops"), Raw(901, first.subject, first.data)]
    gc.collect()
    gc.disable()
    loaded = log.loaded(extra=bad)
    summary = summarize(loaded)
    assert (loaded.intake.refused, loaded.intake.illegal) == (1, 1)
    assert summary.jobs > 0
    assert gc.collect() == 0


def test_the_pause_restores_the_collector_as_it_was(collector: None) -> None:
    gc.enable()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    with collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_what_the_pause_kept_is_still_collected_after(collector: None) -> None:
    gc.enable()
    with collector_paused():
        cycle: list[object] = []
        cycle.append(cycle)
        del cycle
    assert gc.get_freeze_count() == 0
    assert gc.collect() >= 1
