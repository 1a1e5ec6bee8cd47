"""The site agent's scheduler module: pilot batch jobs submitted, cancelled and followed."""

from lodestream.agents.site.scheduler.backend import build_scheduler
from lodestream.agents.site.scheduler.module import PilotScheduler, SchedulerStats

__all__ = ["PilotScheduler", "SchedulerStats", "build_scheduler"]
