"""Choosing a site for ``site: "auto"`` jobs — pure functions over figures the route reads.

A :class:`Placer` is built from each candidate site's :class:`SiteLoad` (read once for
the whole request, :mod:`lodestream.services.api.loads`) and hands out one
:class:`SiteChoice` per auto job. It counts the jobs it has placed itself, so the jobs of one
request spread as they would one by one: a placed job adds to its site's
backlog, to its turn count and to the work ahead of the next job there.

- ``round_robin``: the site holding the fewest of the caller's jobs of this
  app; ties go by name. From equal counts this rotates a, b, c, a, …; the
  cursor is derived from the read model, so nothing extra is stored.
- ``shortest_backlog``: the site with the fewest jobs not final yet.
- ``fastest_eta``: the site where this job would finish soonest, by what the site's open
  pilots can run (slots and recent run times) and the work already queued there
  (:mod:`lodestream.services.api.capacity`). A site with no open pilot is assumed slow to
  start, not dead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from lodestream.schemas.placement import SiteChoice, SiteFigures
from lodestream.schemas.resources import JobResources
from lodestream.schemas.strategies import Strategy
from lodestream.services.api.capacity import Estimate, RunTimes, SiteCapacity, shape_of, slots

_ONE_SLOT: Final = JobResources()


@dataclass(slots=True)
class SiteLoad:
    """What the read models say of one candidate site."""

    backlog: int  # jobs at the site not final yet
    assigned: dict[str, int]  # app -> the caller's jobs of that app at the site
    capacity: SiteCapacity = field(default_factory=SiteCapacity)


def site_figures(load: SiteLoad, app: str, eta: Estimate) -> SiteFigures:
    """What a site with ``load`` looks like to one more job of ``app`` finishing as ``eta``."""
    return SiteFigures(
        backlog=load.backlog,
        throughput_per_s=eta.throughput_per_s,
        eta_s=eta.eta_s,
        assigned=load.assigned.get(app, 0),
    )


# Each strategy's sort key over a candidate's figures; the site name breaks ties.
_KEYS: Final[dict[Strategy, Callable[[SiteFigures], float]]] = {
    "round_robin": lambda f: f.assigned,
    "shortest_backlog": lambda f: f.backlog,
    "fastest_eta": lambda f: f.eta_s,
}


def choose(strategy: Strategy, candidates: Mapping[str, SiteFigures]) -> SiteChoice:
    """The site ``strategy`` picks among ``candidates`` (at least one), with the figures."""
    key = _KEYS[strategy]
    chosen = min(sorted(candidates), key=lambda site: key(candidates[site]))
    return SiteChoice(strategy=strategy, chosen=chosen, candidates=dict(candidates))


class Placer:
    """Places the auto jobs of one request, one after another, on ``loads``' sites."""

    def __init__(
        self,
        loads: Mapping[str, SiteLoad],
        apps: Mapping[str, frozenset[str]],
        locations: Mapping[str, frozenset[str]],
        runs: RunTimes | None = None,
    ) -> None:
        self._loads = dict(loads)  # site -> load; updated as jobs are placed
        self._apps = apps  # site -> the apps it defines
        self._locations = locations  # site -> the transfer locations it declared
        self._runs = runs or RunTimes()
        # site -> slot-seconds of work before the next job there; grows as jobs are placed
        self._ahead_s = {site: self._runs.queued_s(load.capacity) for site, load in loads.items()}
        self._slots: dict[tuple[str, tuple[int, ...]], int] = {}  # (site, job shape) -> slots

    def sites_for(self, app: str, locations: frozenset[str] = frozenset()) -> list[str]:
        """The candidate sites for a job of ``app`` staging through ``locations``: those that
        define the app and declared every one of the locations, by name."""
        return sorted(
            site
            for site in self._loads
            if app in self._apps.get(site, frozenset())
            and locations <= self._locations.get(site, frozenset())
        )

    def figures(self, site: str, app: str, resources: JobResources = _ONE_SLOT) -> SiteFigures:
        """What ``site`` looks like to the next job of ``app`` shaped as ``resources``."""
        load = self._loads[site]
        key = (site, shape_of(resources))
        fit = self._slots.get(key)
        if fit is None:
            fit = self._slots[key] = slots(load.capacity.pilots, resources)
        run_s = self._runs.of(load.capacity, app)
        return site_figures(load, app, Estimate.at(fit, run_s, self._ahead_s[site]))

    def place(
        self,
        app: str,
        strategy: Strategy,
        locations: frozenset[str] = frozenset(),
        resources: JobResources = _ONE_SLOT,
    ) -> SiteChoice | None:
        """Choose a site for one job of ``app``; None when no site can take it."""
        sites = self.sites_for(app, locations)
        if not sites:
            return None
        choice = choose(strategy, {site: self.figures(site, app, resources) for site in sites})
        load = self._loads[choice.chosen]
        load.backlog += 1
        load.assigned[app] = load.assigned.get(app, 0) + 1
        self._ahead_s[choice.chosen] += self._runs.of(load.capacity, app)
        return choice
