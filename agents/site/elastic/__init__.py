"""The elastic queue: pilot batch jobs requested and deleted to follow the site's backlog."""

from lodestream.agents.site.elastic.policy import Plan, Planned, plan
from lodestream.agents.site.elastic.queue import ElasticQueue
from lodestream.agents.site.elastic.scalerlog import ScalerLog

__all__ = ["ElasticQueue", "Plan", "Planned", "ScalerLog", "plan"]
