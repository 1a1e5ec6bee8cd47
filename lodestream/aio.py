"""Running a process's main coroutine on the fastest event loop available.

The services, the site agent and the pilot spend much of their time in the
event loop itself (socket reads, TLS, callbacks, timers); uvloop does that
work in C, roughly halving it. ``LODE_EVENT_LOOP=asyncio`` selects the
standard loop instead, to rule the loop out when debugging.

:func:`run_service` is for the processes that run for hours (projector, controller, site
agent, pilot): it also tunes the cyclic collector once start-up is done (collector.py).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

from lodestream.collector import tune_collector

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    if os.environ.get("LODE_EVENT_LOOP", "uvloop") != "asyncio":
        try:
            import uvloop  # noqa: PLC0415 - optional: absent on platforms without a wheel
        except ImportError:
            pass
        else:
            return uvloop.run(main)
    return asyncio.run(main)


def run_service(main: Coroutine[Any, Any, T]) -> T:
    """:func:`run` for a long-running process, its collector tuned first."""
    tune_collector()
    return run(main)
