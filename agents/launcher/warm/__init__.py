"""Warm Python workers: function jobs run in forks of a template that imported the apps."""

from lodestream.agents.launcher.warm.pool import WarmPool
from lodestream.agents.launcher.warm.task import WarmTask

__all__ = ["WarmPool", "WarmTask"]
