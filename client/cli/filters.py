"""The job filters ``lode job ls``, ``kill`` and ``reset`` share (Balsam #374): one set of
options, one parser, so a filter that lists jobs selects the same jobs to kill or reset."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import typer

from lodestream.schemas.states import JobState

SITE_OPTION = typer.Option(None, "--site", help="Only jobs at this site.")
APP_OPTION = typer.Option(None, "--app", help="Only jobs of this app.")
STATE_OPTION = typer.Option(
    [], "--state", help="Only jobs in this state (repeatable), e.g. RUNNING, FAILED."
)
TAG_OPTION = typer.Option(
    [], "--tag", "-t", help="Only jobs with tag key:value (repeatable; all must match)."
)
SINCE_OPTION = typer.Option(
    None, "--since", help="Only jobs created since: a duration (30s, 10m, 2h, 1d) or a time."
)
PARENT_OPTION = typer.Option(None, "--parent", help="Only children of this job id.")

_DURATION: Final = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}
STATES: Final = tuple(s.value for s in JobState)


def parse_since(value: str, *, now: datetime | None = None) -> datetime:
    """``10m`` → ten minutes before ``now``; an ISO time as given (UTC if it has no zone)."""
    match = _DURATION.match(value.strip())
    if match:
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
        return (now or datetime.now(UTC)) - timedelta(seconds=seconds)
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise typer.BadParameter(
            f"--since {value!r}: give a duration (30s, 10m, 2h, 1d) or an ISO time "
            "(2025-01-02T03:04:05+00:00)"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def parse_states(values: list[str]) -> list[str]:
    """State names, case-insensitive; an unknown one is a usage error listing the known."""
    states = []
    for value in values:
        name = value.strip().upper()
        if name not in STATES:
            raise typer.BadParameter(
                f"--state {value!r} is not a job state; states: {', '.join(STATES)}"
            )
        states.append(name)
    return states


def parse_tag(value: str, option: str = "--tag") -> tuple[str, str]:
    """``key:value`` → ``(key, value)``, the one tag syntax of every surface (the API's filter
    form). ``key=value`` is refused with the right spelling of what was meant."""
    key, found, tag = value.partition(":")
    if found and key and "=" not in key:
        return key, tag
    eq_key, eq, eq_value = value.partition("=")
    hint = f"; write {option} {eq_key}:{eq_value}" if eq and eq_key else ""
    raise typer.BadParameter(f"{option} must look like key:value, got {value!r}{hint}")


def parse_tags(values: list[str], option: str = "--tag") -> list[str]:
    """``key:value`` tags → the API's ``key:value`` filter strings, checked."""
    return [":".join(parse_tag(value, option)) for value in values]


def tag_dict(values: list[str], option: str = "--tag") -> dict[str, str]:
    """``key:value`` tags → ``{key: value}``, as a job's or a batch job's tags are sent."""
    return dict(parse_tag(value, option) for value in values)


@dataclass(frozen=True, slots=True)
class JobFilter:
    """The filters given on the command line, as ``GET /jobs`` takes them."""

    site: str | None = None
    app: str | None = None
    states: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    since: datetime | None = None
    parent: str | None = None

    @classmethod
    def from_options(
        cls,
        site: str | None,
        app: str | None,
        state: list[str],
        tag: list[str],
        since: str | None,
        parent: str | None,
    ) -> JobFilter:
        return cls(
            site=site,
            app=app,
            states=parse_states(state),
            tags=parse_tags(tag),
            since=parse_since(since) if since else None,
            parent=parent,
        )

    @property
    def empty(self) -> bool:
        return not (self.site or self.app or self.states or self.tags or self.since or self.parent)

    def params(self) -> dict[str, Any]:
        """Query parameters of ``GET /jobs``."""
        params: dict[str, Any] = {}
        if self.site:
            params["site"] = self.site
        if self.app:
            params["app"] = self.app
        if self.states:
            params["state"] = self.states
        if self.tags:
            params["tag"] = self.tags
        if self.since:
            params["created_after"] = self.since.isoformat()
        if self.parent:
            params["parent_id"] = self.parent
        return params

    def selection(self, ids: list[str]) -> dict[str, Any]:
        """The body of ``POST /jobs/kill`` and ``/jobs/reset`` (``ids``: among these only)."""
        selection: dict[str, Any] = {"ids": ids} if ids else {}
        for name, value in (("site", self.site), ("app", self.app), ("states", self.states),
                            ("tags", self.tags), ("parent_id", self.parent)):  # fmt: skip
            if value:
                selection[name] = value
        if self.since:
            selection["created_after"] = self.since.isoformat()
        return selection
