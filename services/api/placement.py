"""Choosing a site for ``site: "auto"`` jobs — pure functions over figures the route reads.

A :class:`Placer` is built from each candidate site's :class:`SiteLoad` (one
query per figure for the whole request) and hands out one :class:`SiteChoice`
per auto job. It counts the jobs it has placed itself, so the jobs of one
request spread as they would one by one: a placed job adds to its site's
backlog and to its turn count.

- ``round_robin``: the site holding the fewest of the caller's jobs of this
  app; ties go by name. From equal counts this rotates a, b, c, a, …; the
  cursor is derived from the read model, so nothing extra is stored.
- ``shortest_backlog``: the site with the fewest jobs not final yet.
- ``fastest_eta``: the site whose backlog (plus this job) drains soonest at
  the rate it finished jobs over the recent window. A site that finished
  nothing lately gets a floor rate, not zero: it is assumed slow, not dead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from lodestream.schemas.placement import SiteChoice, SiteFigures
from lodestream.schemas.strategies import Strategy

THROUGHPUT_WINDOW_S: Final = 600.0
THROUGHPUT_FLOOR_PER_S: Final = 1 / 3600  # one job an hour: what an unmeasured site is taken for


@dataclass(slots=True)
class SiteLoad:
    """What the read models say of one candidate site."""

    backlog: int  # jobs at the site not final yet
    finished_recently: int  # jobs it finished within the window
    assigned: dict[str, int]  # app -> the caller's jobs of that app at the site

    def throughput_per_s(self, window_s: float) -> float:
        return max(self.finished_recently / window_s, THROUGHPUT_FLOOR_PER_S)

    def figures(self, app: str, window_s: float) -> SiteFigures:
        rate = self.throughput_per_s(window_s)
        return SiteFigures(
            backlog=self.backlog,
            throughput_per_s=rate,
            eta_s=(self.backlog + 1) / rate,
            assigned=self.assigned.get(app, 0),
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
        *,
        window_s: float = THROUGHPUT_WINDOW_S,
    ) -> None:
        self._loads = dict(loads)  # site -> load; updated as jobs are placed
        self._apps = apps  # site -> the apps it defines
        self._locations = locations  # site -> the transfer locations it declared
        self._window_s = window_s

    def sites_for(self, app: str, locations: frozenset[str] = frozenset()) -> list[str]:
        """The candidate sites for a job of ``app`` staging through ``locations``: those that
        define the app and declared every one of the locations, by name."""
        return sorted(
            site
            for site in self._loads
            if app in self._apps.get(site, frozenset())
            and locations <= self._locations.get(site, frozenset())
        )

    def place(
        self, app: str, strategy: Strategy, locations: frozenset[str] = frozenset()
    ) -> SiteChoice | None:
        """Choose a site for one job of ``app``; None when no site can take it."""
        sites = self.sites_for(app, locations)
        if not sites:
            return None
        figures = {site: self._loads[site].figures(app, self._window_s) for site in sites}
        choice = choose(strategy, figures)
        load = self._loads[choice.chosen]
        load.backlog += 1
        load.assigned[app] = load.assigned.get(app, 0) + 1
        return choice
