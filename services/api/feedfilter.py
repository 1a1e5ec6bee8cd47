"""What a caller of the push feed asks for: sites, kinds, event types and jobs.

The same names as the query of ``GET /events/stream`` (each may repeat). A filter is
turned into the subject filters of the caller's JetStream consumer, so the server sends
only the caller's own sites' events, and only of the kinds and types asked for; the job
ids are checked here, on the events that arrive.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from lodestream.schemas.envelope import Event
from lodestream.schemas.subjects import KINDS, type_filter
from lodestream.schemas.trust import event_types
from lodestream.services.api.errors import InvalidInput, NotFound

FILTER_NAMES: Final = ("site", "kind", "type", "job")
RESUME_NAMES: Final = ("since",)
MAX_VALUES: Final = 100  # per name; a consumer's filter is one subject per site and type
MAX_SUBJECTS: Final = 1000


@dataclass(frozen=True, slots=True)
class FeedFilter:
    sites: frozenset[str]  # the caller's sites, all of them when none was asked for
    kinds: frozenset[str] = frozenset()
    types: frozenset[str] = frozenset()
    jobs: frozenset[uuid.UUID] = frozenset()

    def subjects(self) -> list[str]:
        """The consumer's subject filters (never empty: a caller with no site has no feed)."""
        subjects: list[str] = []
        for site in sorted(self.sites):
            if self.types:
                subjects += [type_filter(site, t) for t in sorted(self.types)]
            elif self.jobs:
                subjects += [f"evt.{site}.job.{job}.*" for job in sorted(map(str, self.jobs))]
            elif self.kinds:
                subjects += [f"evt.{site}.{kind}.>" for kind in sorted(self.kinds)]
            else:
                subjects.append(f"evt.{site}.>")
        return subjects

    def accepts(self, event: Event) -> bool:
        # The subjects already say site, kind and type; a type filter with job ids needs this.
        kind = event.type.partition(".")[0]
        return (
            event.site in self.sites
            and (not self.kinds or kind in self.kinds)
            and (not self.types or event.type in self.types)
            and (not self.jobs or (kind == "job" and event.aggregate_id in self.jobs))
        )


def parse_filter(query: Mapping[str, Sequence[str]], own_sites: Collection[str]) -> FeedFilter:
    """The filter a query asks for; 422 for an unknown name or value, 404 for another's site."""
    unknown = sorted(set(query) - set(FILTER_NAMES) - set(RESUME_NAMES))
    if unknown:
        raise InvalidInput(
            f"unknown filter {', '.join(map(repr, unknown))}: the feed filters by "
            f"{', '.join(FILTER_NAMES)} (each may repeat) and resumes from 'since'",
            {"unknown": unknown, "allowed": [*FILTER_NAMES, *RESUME_NAMES]},
        )
    for name in FILTER_NAMES:
        if len(query.get(name, ())) > MAX_VALUES:
            raise InvalidInput(f"at most {MAX_VALUES} values of {name!r}")
    sites = frozenset(query.get("site", ()))
    for site in sorted(sites - set(own_sites)):
        raise NotFound(f"site {site!r} not found")
    kinds = frozenset(query.get("kind", ()))
    if kinds - KINDS:
        raise InvalidInput(
            f"unknown kind {sorted(kinds - KINDS)[0]!r}: one of {', '.join(sorted(KINDS))}"
        )
    types = frozenset(query.get("type", ()))
    if types - event_types():
        raise InvalidInput(
            f"unknown event type {sorted(types - event_types())[0]!r} (e.g. job.finished)"
        )
    try:
        jobs = frozenset(uuid.UUID(value) for value in query.get("job", ()))
    except ValueError as exc:
        raise InvalidInput(f"a job filter must be a job id (a UUID): {exc}") from exc
    chosen = FeedFilter(sites or frozenset(own_sites), kinds, types, jobs)
    if len(chosen.subjects()) > MAX_SUBJECTS:
        raise InvalidInput(f"the filter names more than {MAX_SUBJECTS} site/type combinations")
    return chosen
