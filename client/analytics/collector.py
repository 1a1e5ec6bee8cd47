"""Python's cyclic garbage collector, paused while the analytics build and read timelines.

A replay keeps every timeline it builds and makes many short-lived objects per event (each
batch's decoded events outlive the collector's young generations); the figures then make
lists and tuples by the million while reading them. Either way, every so often a full
collection walks all the timelines again: half the time of a replay, and more the longer
the log (a full collection's cost grows with everything kept). Neither makes reference
cycles (what they drop, reference counting frees at once), so the collector would find
nothing; ``tests/unit/test_analytics_collector.py`` checks that it finds nothing.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


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
