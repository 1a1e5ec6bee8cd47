"""Choosing a site for a job submitted with ``site: "auto"`` (the Balsam paper's §4.6).

The API resolves ``auto`` to one of the caller's live sites that define the
job's app, by a :data:`Strategy`, and records the choice and the figures it
was made on in the job's ``job.created`` event (:class:`SiteChoice`), so the
decision can be audited and analysed from the log alone. The strategies
themselves are pure functions in ``services/api/placement.py``.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from lodestream.schemas.envelope import EventData
from lodestream.schemas.resources import INT64_MAX
from lodestream.schemas.strategies import Strategy
from lodestream.schemas.subjects import SiteSlug


class SiteFigures(EventData):
    """What the read models said of one candidate site when the choice was made.

    ``backlog``: the site's jobs not final yet (this request's earlier auto jobs included);
    ``throughput_per_s``: jobs of this app its open pilots run per second (slots / median
    run time; one slot if none is open); ``eta_s``: seconds until this job would finish
    there, given the work queued ahead of it (``services/api/capacity.py``);
    ``assigned``: the caller's jobs of this app the site already holds (round robin's turn).
    """

    backlog: int = Field(ge=0, le=INT64_MAX)
    throughput_per_s: float = Field(gt=0, allow_inf_nan=False)
    eta_s: float = Field(ge=0, allow_inf_nan=False)
    assigned: int = Field(0, ge=0, le=INT64_MAX)


class SiteChoice(EventData):
    """Which site ``site: "auto"`` resolved to, by which strategy, among which candidates."""

    strategy: Strategy
    chosen: SiteSlug
    candidates: dict[SiteSlug, SiteFigures] = Field(min_length=1)

    @model_validator(mode="after")
    def _chosen_is_a_candidate(self) -> SiteChoice:
        if self.chosen not in self.candidates:
            raise ValueError(f"chosen site {self.chosen!r} is not among the candidates")
        return self
