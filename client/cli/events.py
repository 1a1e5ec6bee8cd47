"""``lode events``: your job events, filtered, the newest few or from a point, and live.

It reads the projected feed (``GET /events?after_seq=``), woken by the push feed, through
:meth:`LodeClient.follow_events`; only that method knows how events arrive.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import typer
from rich.text import Text

from lodestream.client.cli.common import STATE_DIR_OPTION, api_client, console
from lodestream.client.cli.filters import parse_since, parse_states
from lodestream.client.errors import ApiError
from lodestream.client.sdk import LodeClient
from lodestream.schemas.states import TRANSITIONS

# The state machine's table names every job event type (a test checks it against the
# event classes), without the event models, which every `lode` start would import here.
EVENT_TYPES: Final = tuple(TRANSITIONS)


@dataclass(frozen=True, slots=True)
class EventFilter:
    sites: frozenset[str]
    types: frozenset[str]
    jobs: frozenset[str]
    states: frozenset[str]  # the state an event led to
    since: datetime | None

    def __call__(self, event: dict[str, Any]) -> bool:
        return (
            (not self.sites or event["site"] in self.sites)
            and (not self.types or event["type"] in self.types)
            and (not self.jobs or event["job_id"] in self.jobs)
            and (not self.states or event.get("to_state") in self.states)
            and (self.since is None or datetime.fromisoformat(event["occurred_at"]) >= self.since)
        )


def parse_types(values: list[str]) -> frozenset[str]:
    """``finished`` or ``job.finished``; an unknown type is a usage error listing the known."""
    types = set()
    for value in values:
        name = value if value.startswith("job.") else f"job.{value}"
        if name not in EVENT_TYPES:
            raise typer.BadParameter(
                f"--type {value!r} is not a job event type; types: {', '.join(EVENT_TYPES)}"
            )
        types.add(name)
    return frozenset(types)


def events(
    site: list[str] = typer.Option([], "--site", help="Only events at this site (repeatable)."),
    event_type: list[str] = typer.Option(
        [], "--type", help="Only this event type, e.g. finished or job.failed (repeatable)."
    ),
    job: list[str] = typer.Option([], "--job", help="Only this job's events (repeatable)."),
    state: list[str] = typer.Option([], "--state", help="Only events that led to this state."),
    since: str | None = typer.Option(
        None,
        "--since",
        help="From this stream sequence (a number), or since a duration (10m) or time; "
        "without it, the newest --lines events.",
    ),
    lines: int = typer.Option(20, "--lines", "-n", min=1, help="How many of the newest to show."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new events."),
    poll_s: float = typer.Option(
        1.0, "--poll", min=0.1, help="Seconds between polls (follow, where the api cannot push)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per line."),
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """Show your job events in log order: the newest few, or from a point; --follow tails."""
    after_seq, moment = 0, None
    if since is not None and since.strip().isdigit():
        after_seq = int(since)
    elif since is not None:
        moment = parse_since(since)
    keep = EventFilter(frozenset(site), parse_types(event_type), frozenset(job),
                       frozenset(parse_states(state)), moment)  # fmt: skip
    if not as_json:
        console.print(Text(HEADER, style="bold"), highlight=False)
    with api_client(state_dir) as client:
        _check_sites(client, site)
        try:
            if since is None:  # the newest `lines` up to now, then (with --follow) on from there
                newest: deque[dict[str, Any]] = deque(maxlen=lines)
                for event in client.follow_events(0, until_caught_up=True):
                    after_seq = int(event["seq"])
                    if keep(event):
                        newest.append(event)
                _print(newest, as_json)
                if not follow:
                    return
            feed = client.follow_events(after_seq, poll_s=poll_s, until_caught_up=not follow)
            _print((event for event in feed if keep(event)), as_json)
        except KeyboardInterrupt:  # the way out of --follow
            return


def _check_sites(client: LodeClient, names: list[str]) -> None:
    """A site that is not yours is a 404, as ``lode job submit`` says it (a removed site of
    yours still has events)."""
    own = {str(s["name"]) for s in client.list_sites(include_removed=True)} if names else set()
    for name in names:
        if name not in own:
            raise ApiError(404, "not_found", f"site {name!r} not found")


HEADER: Final = f"{'seq':<9} {'at':<32} {'site':<11} {'type':<21} {'job':<36}  from → to"


def _print(stream: Iterable[dict[str, Any]], as_json: bool) -> None:
    """One line per event as it comes (a table would wait for the end of a followed feed)."""
    for event in stream:
        if as_json:
            typer.echo(json.dumps(event))
            continue
        to_state = event.get("to_state")
        move = f"{event.get('from_state') or '·'} → {to_state}" if to_state else ""
        console.print(
            Text(f"{event['seq']:<9} {event['occurred_at']:<32} {event['site']:<11} "
                 f"{event['type']:<21} {event['job_id']:<36}  {move}"),
            highlight=False, soft_wrap=True,
        )  # fmt: skip
