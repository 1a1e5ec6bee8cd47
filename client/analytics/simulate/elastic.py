"""The elastic queue under other settings: the recorded decisions' inputs, decided again.

Each ``scaler.decided`` on the log records everything the site's policy decided on (the
backlog as the control plane saw it, the backfill windows, the limits, the clock), and the
policy (:func:`lodestream.agents.site.elastic.policy.plan`) is a pure function of them. So
the backlog over time can be replayed against other limits, and what the queue would have
requested compared with what it did.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from lodestream.agents.site.elastic.policy import plan
from lodestream.client.analytics.simulate.errors import BadScenario
from lodestream.schemas.events.scaler import ScalerDecided, ScalerLimits


@dataclass(frozen=True, slots=True)
class ScalerReplay:
    decisions: int
    recorded_jobs: int  # batch jobs requested
    recorded_nodes: int
    replayed_jobs: int
    replayed_nodes: int
    recorded_deletions: int
    replayed_deletions: int


def replay_scaler(decisions: Sequence[ScalerDecided], changes: Mapping[str, Any]) -> ScalerReplay:
    """Decide every recorded decision's inputs again with ``changes`` to its limits."""
    jobs = nodes = deletions = 0
    for decision in decisions:
        data = decision.data
        try:
            limits = ScalerLimits.model_validate({**data.limits.model_dump(), **changes})
        except ValidationError as exc:
            why = "; ".join(str(e["msg"]) for e in exc.errors())
            raise BadScenario(f"elastic queue settings: {why}") from exc
        again = plan(data.backlog, data.windows, limits, decision.occurred_at)
        jobs += len(again.requests)
        nodes += sum(p.request.num_nodes for p in again.requests)
        deletions += len(again.deletions)
    return ScalerReplay(
        decisions=len(decisions),
        recorded_jobs=sum(len(d.data.requests) for d in decisions),
        recorded_nodes=sum(r.request.num_nodes for d in decisions for r in d.data.requests),
        replayed_jobs=jobs, replayed_nodes=nodes,
        recorded_deletions=sum(len(d.data.deletions) for d in decisions),
        replayed_deletions=deletions,
    )  # fmt: skip
