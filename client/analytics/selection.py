"""Which jobs and pilots an analysis covers: :class:`Selection`.

A job is selected by its ``job.created``: its site, app and tags, and its creation time
(``since`` ≤ created ≤ ``until``); every later event of a selected job follows it, whenever
it happened, so a job's timeline is whole. Pilot sessions and batch jobs are selected by
site and by opening no later than ``until``; the figures clip them to the window.

``since_seq`` is where reading starts (a stream sequence); ``since`` and ``until`` are
producer times. Reading live from a time starts a little earlier (:data:`CLOCK_SLACK_S`)
and lets this selection decide, so that a producer's clock slightly behind the server's
loses no job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Final

from lodestream.client.analytics.errors import AnalyticsError
from lodestream.schemas.errors import SubjectError
from lodestream.schemas.events.job import JobCreated
from lodestream.schemas.subjects import check_site

CLOCK_SLACK_S: Final = 60.0

_State = tuple[
    frozenset[str], frozenset[str], dict[str, str], int | None, float | None, float | None
]


@dataclass(frozen=True, slots=True)
class Selection:
    """Filters of an analysis (empty: everything). Build with :meth:`of` to have them checked."""

    sites: frozenset[str] = frozenset()
    apps: frozenset[str] = frozenset()
    tags: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    since_seq: int | None = None
    since: float | None = None  # POSIX seconds
    until: float | None = None

    @classmethod
    def of(
        cls,
        *,
        sites: Iterable[str] = (),
        apps: Iterable[str] = (),
        tags: Mapping[str, str] | None = None,
        since_seq: int | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> Selection:
        """A checked selection; :class:`AnalyticsError` says what is wrong with an argument."""
        try:
            checked_sites = frozenset(check_site(s) for s in sites)
        except SubjectError as exc:
            raise AnalyticsError(str(exc)) from exc
        if since_seq is not None and since_seq < 1:
            raise AnalyticsError(f"a start sequence must be 1 or more, got {since_seq}")
        for name, moment in (("since", since), ("until", until)):
            if moment is not None and moment.tzinfo is None:
                raise AnalyticsError(f"{name}: a time must carry its time zone")
        if since is not None and until is not None and until <= since:
            raise AnalyticsError(f"until ({until.isoformat()}) is not after since "
                                 f"({since.isoformat()}): the range is empty")  # fmt: skip
        return cls(
            sites=checked_sites,
            apps=frozenset(apps),
            tags=MappingProxyType(dict(tags or {})),
            since_seq=since_seq,
            since=since.timestamp() if since is not None else None,
            until=until.timestamp() if until is not None else None,
        )

    # pickle refuses the read-only view of the tags; a replay split across processes sends
    # the selection to each of them, so it travels with the tags as a plain dict.
    def __getstate__(self) -> _State:
        return (self.sites, self.apps, dict(self.tags), self.since_seq, self.since, self.until)

    def __setstate__(self, state: _State) -> None:
        sites, apps, tags, since_seq, since, until = state
        fields = {"sites": sites, "apps": apps, "tags": MappingProxyType(tags),
                  "since_seq": since_seq, "since": since, "until": until}  # fmt: skip
        for name, value in fields.items():
            object.__setattr__(self, name, value)  # frozen: as its own __init__ does

    def admits_site(self, site: str) -> bool:
        return not self.sites or site in self.sites

    def admits_opening(self, site: str, at: float) -> bool:
        """A pilot session or batch job of ``site`` that began at ``at``."""
        return self.admits_site(site) and (self.until is None or at <= self.until)

    def admits_job(self, created: JobCreated) -> bool:
        """The job ``created`` makes falls in the selection."""
        if not self.admits_site(created.site):
            return False
        spec = created.data
        if self.apps and spec.app not in self.apps:
            return False
        if self.tags and any(spec.tags.get(k) != v for k, v in self.tags.items()):
            return False
        at = created.occurred_at.timestamp()
        return (self.since is None or at >= self.since) and (self.until is None or at <= self.until)

    @property
    def filtered(self) -> bool:
        """True if anything narrows the log (to word an empty result)."""
        return bool(self.sites or self.apps or self.tags or self.since or self.until)

    def describe(self) -> str:
        """The filters in words, for messages."""
        parts = []
        if self.sites:
            parts.append("site " + ", ".join(sorted(self.sites)))
        if self.apps:
            parts.append("app " + ", ".join(sorted(self.apps)))
        if self.tags:
            parts.append("tags " + ", ".join(f"{k}={v}" for k, v in sorted(self.tags.items())))
        if self.since_seq is not None:
            parts.append(f"from sequence {self.since_seq}")
        if self.since is not None:
            parts.append(f"created since {_iso(self.since)}")
        if self.until is not None:
            parts.append(f"until {_iso(self.until)}")
        return "; ".join(parts) or "everything"


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")
