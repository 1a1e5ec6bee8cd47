"""Errors of the what-if simulator; the CLI prints their message, never a traceback.

SimulationError (ValueError)
├── NothingToCalibrate   the recording holds no job that ran to its end
└── BadScenario          a capacity, strategy or storage setting that means nothing
"""

from __future__ import annotations


class SimulationError(ValueError):
    """Base of the simulator's errors."""


class NothingToCalibrate(SimulationError):
    """The events hold no finished job to take run times and overheads from."""


class BadScenario(SimulationError):
    """A scenario the simulator cannot run (zero slots, a bandwidth of 0, ...)."""
