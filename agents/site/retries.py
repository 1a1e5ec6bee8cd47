"""Each app's retry rules: its budget and its backoff, the site's settings under its own.

The site sets both for every app (``processing.retry_budget``,
``processing.retry_backoff``); an app may set its own budget
(``retry_budget``) and change any field of the backoff (``retry_backoff``).
They are merged once, when the agent starts, so an app whose values do not
make a valid backoff stops ``lode site start`` with the app's name instead of
failing jobs later.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import ValidationError

from lodestream.agents.site.apps import ApplicationDefinition
from lodestream.agents.site.apps.errors import AppDefinitionError
from lodestream.agents.site.settings import ProcessingSettings
from lodestream.schemas.retry import RetryBackoff


@dataclass(frozen=True, slots=True)
class RetryPlan:
    """How often, and how patiently, one app's jobs are run again."""

    max_attempts: int  # the first run included
    backoff: RetryBackoff


@dataclass(frozen=True, slots=True)
class RetryRules:
    site: RetryPlan
    apps: Mapping[str, RetryPlan]

    def of(self, app: str) -> RetryPlan:
        return self.apps.get(app, self.site)

    @classmethod
    def build(
        cls, settings: ProcessingSettings, apps: Mapping[str, type[ApplicationDefinition]]
    ) -> RetryRules:
        """The site's rules and each app's; ``AppDefinitionError`` names an app whose own
        values do not make a valid backoff with the site's."""
        site = RetryPlan(settings.retry_budget + 1, settings.retry_backoff)
        plans: dict[str, RetryPlan] = {}
        for name, app in apps.items():
            spec = app.spec
            budget = settings.retry_budget if spec.retry_budget is None else spec.retry_budget
            backoff = settings.retry_backoff
            if spec.retry_backoff:
                fields = {**settings.retry_backoff.model_dump(), **spec.retry_backoff}
                try:
                    backoff = RetryBackoff.model_validate(fields)
                except ValidationError as exc:
                    problems = "; ".join(
                        f"{'.'.join(str(p) for p in err['loc']) or 'retry_backoff'}: {err['msg']}"
                        for err in exc.errors()
                    )
                    raise AppDefinitionError(
                        f"ApplicationDefinition {app.__name__}: retry_backoff (over the site's "
                        f"{settings.retry_backoff.model_dump()}): {problems}"
                    ) from exc
            plans[name] = RetryPlan(budget + 1, backoff)
        return cls(site=site, apps=plans)
