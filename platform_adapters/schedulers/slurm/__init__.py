"""The Slurm adapter: one module per concern (states, render, parse, accounting, backfill)."""

from lodestream.platform_adapters.schedulers.slurm.scheduler import SlurmScheduler
from lodestream.platform_adapters.schedulers.slurm.states import SLURM_STATES

__all__ = ["SLURM_STATES", "SlurmScheduler"]
