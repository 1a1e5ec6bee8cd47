"""Python's cyclic garbage collector, kept off the hot paths that make no reference cycles.

A reader of the log keeps what it folds (the analytics every timeline, the rebuild every
job until its one write, the live projector the jobs of the last minutes) and makes many
short-lived objects per event. With the default thresholds the collector runs every 700
allocations, and every so often a full collection walks everything kept again: half the
time of an analytics replay, a fifth of the live projector's CPU, more the more is kept (a
full collection's cost grows with all of it). What they fold makes no reference cycles
(what they drop, reference counting frees at once), so the collector would find nothing
there; the tests of each (``test_analytics_collector.py``, ``test_projection_cycles.py``)
check that it finds nothing.

* :func:`collector_paused`, for a bounded piece of work (a replay, a rebuild);
* :func:`tune_collector`, for a process that folds for ever (the live projector): reference
  cycles made elsewhere in it are still collected, only less often. Every long-running
  process (projector, controller, site agent, pilot) is tuned so, by ``aio.run_service``:
  they too make a few thousand short-lived objects per job, and in a pilot running no-op
  jobs the collector took 2.7 % of its CPU (perf, lifecycle benchmark), most of it walking
  what start-up made.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Final

SERVICE_GEN0_THRESHOLD: Final = 50_000
"""Allocations between two young collections in a tuned process (CPython's default: 700);
the older generations keep their ratios' order of magnitude (20 young, then 20 middle)."""


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic collector inside the block, and restore it as it was."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if gc.get_freeze_count() == 0:  # none frozen by the program itself, to be kept so
            # What the block made and kept goes straight to the oldest generation, as the
            # young collections would move it (walking all of it on the way) once resumed;
            # the next full collection still looks at all of it.
            gc.freeze()
            gc.unfreeze()
        gc.enable()


def tune_collector() -> None:
    """Once, after start-up: what exists now (modules, models, schemas) is left out of every
    collection for the life of the process, and young collections are rarer."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(SERVICE_GEN0_THRESHOLD, 20, 20)
