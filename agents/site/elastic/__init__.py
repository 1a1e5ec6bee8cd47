"""The elastic queue: pilot batch jobs requested and deleted to follow the site's backlog."""

from lodestream.agents.site.elastic.policy import Plan, Planned, plan
from lodestream.agents.site.elastic.queue import ElasticQueue
from lodestream.agents.site.elastic.scalerlog import ScalerLog
from lodestream.agents.site.elastic.wiring import backfill_scheduler

__all__ = ["ElasticQueue", "Plan", "Planned", "ScalerLog", "backfill_scheduler", "plan"]
