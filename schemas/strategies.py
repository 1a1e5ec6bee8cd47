"""The names a submission uses to let the API choose its site: ``site: "auto"`` and a strategy.

Apart from :mod:`lodestream.schemas.placement` (the recorded choice, as event payload
models) so that ``lode`` can offer these names at every start without importing the
models: its command tree is built at each start, and the models took a tenth of a second.
"""

from __future__ import annotations

from typing import Final, Literal

AUTO_SITE: Final = "auto"
"""The site name a submission gives to let the API choose; no site may be registered so."""

RESERVED_SITE_NAMES: Final = frozenset({AUTO_SITE})

Strategy = Literal["round_robin", "shortest_backlog", "fastest_eta"]
STRATEGIES: Final[tuple[Strategy, ...]] = ("round_robin", "shortest_backlog", "fastest_eta")
DEFAULT_STRATEGY: Final[Strategy] = "shortest_backlog"
