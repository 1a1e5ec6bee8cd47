"""``lode analytics summary|report|export``: figures of a run, replayed from the log
(``simulate``, the what-if model, lives in :mod:`lodestream.client.cli.analytics_simulate`).

Where the events come from, in order of the options given:

* ``--from-file FILE``: a copy of the log (``lode analytics export``, or ``lode events --json``);
* ``--control-plane``: ``EVENTS`` over the control plane's NATS connection (operators: the
  settings of ``lode projector``, from the environment or the embedded stack's state dir);
* otherwise your sites, read with your monitoring credential as ``lode watch`` reads them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final, TypeVar

import typer

from lodestream import aio
from lodestream.client.cli.analytics_simulate import simulate
from lodestream.client.cli.common import STATE_DIR_OPTION, console, print_error
from lodestream.client.cli.filters import parse_since, tag_dict
from lodestream.client.cli.monitoring import (
    CA_FILE_OPTION,
    CREDENTIAL_OPTION,
    NATS_URL_OPTION,
    check_sites,
    monitor_access,
)
from lodestream.client.errors import CredentialRevoked, LodeClientError
from lodestream.shares import DEFAULT_WORKERS, SPLIT_FROM, SPLIT_FROM_CORES

# The analytics package is imported when a command runs: every `lode` command imports this
# module to register these, and the package took about half a second of each one's start.
if TYPE_CHECKING:
    from lodestream.client.analytics.selection import Selection
    from lodestream.client.analytics.summary import Loaded, Summary
    from lodestream.settings import NatsSettings

T = TypeVar("T")
NEW_KEY_GRACE_S: Final = 15.0  # the control plane applies a new key within a few seconds

analytics_app = typer.Typer(
    help="Figures of a recorded run, replayed from the event log, and what-if predictions.",
    no_args_is_help=True,
)
analytics_app.command("simulate")(simulate)

SITE = typer.Option([], "--site", help="Only this site (repeatable).")
APP = typer.Option([], "--app", help="Only jobs of this app (repeatable).")
TAG = typer.Option([], "--tag", "-t", help="Only jobs with tag key:value (repeatable).")
SINCE = typer.Option(
    None, "--since",
    help="From this stream sequence (a number), or jobs created since a time (ISO) or "
    "duration (10m, 2h); default: the whole log.",
)  # fmt: skip
UNTIL = typer.Option(None, "--until", help="Jobs created until this time or duration ago.")
FROM_FILE = typer.Option(None, "--from-file", help="Read a copy of the log (JSONL) instead.")
CONTROL = typer.Option(
    False, "--control-plane", help="Read EVENTS with the control plane's NATS settings."
)
BIN = typer.Option(None, "--bin", min=0.001, help="Width of the time bins in seconds.")
STEADY = typer.Option(
    None, "--window", metavar="START:END",
    help="Little's law's steady window, in seconds from the window's start (default: the "
    "middle half of the run).",
)  # fmt: skip
WORKERS = typer.Option(
    None, "--workers", min=1,
    help="With --control-plane: processes the replay is split across (at most one per "
    f"core); default: 1, or on {SPLIT_FROM_CORES} cores or more one per core up to "
    f"{DEFAULT_WORKERS} for a range of {SPLIT_FROM:,} events or more.",
)  # fmt: skip


def _selection(
    site: list[str], app: list[str], tag: list[str], since: str | None, until: str | None
) -> Selection:
    from lodestream.client.analytics import AnalyticsError, Selection  # noqa: PLC0415

    since_seq, moment = None, None
    if since is not None and since.strip().isdigit():
        since_seq = int(since)
    elif since is not None:
        moment = parse_since(since)
    try:
        return Selection.of(
            sites=site, apps=app, tags=tag_dict(tag), since_seq=since_seq,
            since=moment, until=parse_since(until) if until else None,
        )  # fmt: skip
    except AnalyticsError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _control_settings(state_dir: Path) -> NatsSettings:
    from lodestream.services.embedded.state import apply_stack_environment  # noqa: PLC0415
    from lodestream.settings import Settings  # noqa: PLC0415

    apply_stack_environment(state_dir, "api")
    return Settings().nats_settings().model_copy(update={"name": "lode-analytics"})


async def _on_control_plane(settings: NatsSettings, work: Callable[..., Awaitable[T]]) -> T:
    from lodestream.client.analytics.connection import control_connection  # noqa: PLC0415

    async with control_connection(settings) as nc:
        return await work(nc)


async def _with_grace(fresh: bool, work: Callable[[], Awaitable[T]]) -> T:
    """``work()``, tried again while a credential registered just now is not applied yet."""
    deadline = time.monotonic() + (NEW_KEY_GRACE_S if fresh else 0.0)
    while True:
        try:
            return await work()
        except CredentialRevoked:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1.0)


def _load(
    selection: Selection,
    from_file: Path | None,
    control_plane: bool,
    credential: tuple[Path | None, str | None, Path | None],
    state_dir: Path,
    workers: int | None,
) -> Loaded:
    from lodestream.client.analytics import load_file, load_watch  # noqa: PLC0415
    from lodestream.client.analytics.parallel import load_stream_parallel  # noqa: PLC0415

    if workers is not None and not control_plane:
        raise typer.BadParameter("only a replay of the stream read with --control-plane is "
                                 "split across processes", param_hint="--workers")  # fmt: skip
    if from_file is not None:
        return load_file(from_file, selection)
    if control_plane:
        settings = _control_settings(state_dir)
        return aio.run(_on_control_plane(settings, lambda nc: load_stream_parallel(
            nc, selection, workers=workers)))  # fmt: skip
    access = monitor_access(state_dir, *credential)
    sites = check_sites(sorted(selection.sites), access.sites)
    return aio.run(_with_grace(access.fresh, lambda: load_watch(
        access.credential, sites, selection, log_end=access.log_end)))  # fmt: skip


def _steady(window: str | None) -> tuple[float, float] | None:
    if window is None:
        return None
    low, sep, high = window.partition(":")
    try:
        bounds = (float(low), float(high))
    except ValueError:
        bounds = (0.0, -1.0)
    if not sep or not 0 <= bounds[0] < bounds[1]:
        raise typer.BadParameter(f"expected START:END seconds, START < END, got {window!r}",
                                 param_hint="--window")  # fmt: skip
    return bounds


def _summary(loaded: Loaded, bin_s: float | None, window: str | None = None) -> Summary:
    from lodestream.client.analytics import AnalyticsError, summarize  # noqa: PLC0415

    steady = _steady(window)
    try:
        return summarize(loaded, bin_s, steady)
    except AnalyticsError as exc:
        print_error(exc)
        raise typer.Exit(1) from exc


def _quiet() -> None:
    # Refusals are listed in the output itself; a warning per skipped event would bury it.
    logging.getLogger("lodestream.client.analytics").setLevel(logging.ERROR)


@analytics_app.command("summary")
def summary_command(
    site: list[str] = SITE,
    app: list[str] = APP,
    tag: list[str] = TAG,
    since: str | None = SINCE,
    until: str | None = UNTIL,
    from_file: Path | None = FROM_FILE,
    control_plane: bool = CONTROL,
    bin_s: float | None = BIN,
    window: str | None = STEADY,
    workers: int | None = WORKERS,
    as_json: bool = typer.Option(False, "--json", help="Print the figures as one JSON object."),
    credential_file: Path | None = CREDENTIAL_OPTION,
    nats_url: str | None = NATS_URL_OPTION,
    ca_file: Path | None = CA_FILE_OPTION,
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """Throughput, utilization, stage latencies (Table 1), Little's law, failures, overheads."""
    _quiet()
    selection = _selection(site, app, tag, since, until)
    _steady(window)  # refused before the log is read, not after
    try:
        loaded = _load(selection, from_file, control_plane, (credential_file, nats_url, ca_file),
                       state_dir, workers)  # fmt: skip
    except LodeClientError as exc:
        print_error(exc)
        raise typer.Exit(1) from exc
    summary = _summary(loaded, bin_s, window)
    if as_json:
        from lodestream.client.analytics.jsonout import summary_json  # noqa: PLC0415

        typer.echo(json.dumps(summary_json(summary)))
    else:
        from lodestream.client.cli.analytics_tables import print_summary  # noqa: PLC0415

        print_summary(console, summary)


@analytics_app.command("report")
def report_command(
    out: Path = typer.Option(..., "--out", help="Directory for index.html and the plots."),
    site: list[str] = SITE,
    app: list[str] = APP,
    tag: list[str] = TAG,
    since: str | None = SINCE,
    until: str | None = UNTIL,
    from_file: Path | None = FROM_FILE,
    control_plane: bool = CONTROL,
    bin_s: float | None = BIN,
    window: str | None = STEADY,
    workers: int | None = WORKERS,
    credential_file: Path | None = CREDENTIAL_OPTION,
    nats_url: str | None = NATS_URL_OPTION,
    ca_file: Path | None = CA_FILE_OPTION,
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """Write an HTML report with plots (needs the analytics extra: matplotlib)."""
    _quiet()
    selection = _selection(site, app, tag, since, until)
    _steady(window)
    try:
        from lodestream.client.analytics.report import write_report  # noqa: PLC0415

        loaded = _load(selection, from_file, control_plane, (credential_file, nats_url, ca_file),
                       state_dir, workers)  # fmt: skip
        summary = _summary(loaded, bin_s, window)
        index = write_report(out, summary, loaded.timelines)
    except LodeClientError as exc:
        print_error(exc)
        raise typer.Exit(1) from exc
    console.print(f"report written: {index}")


@analytics_app.command("export")
def export_command(
    out: Path = typer.Option(..., "--out", help="The JSONL file to write."),
    site: list[str] = SITE,
    app: list[str] = APP,
    tag: list[str] = TAG,
    since: str | None = typer.Option(
        None, "--since", help="From this stream sequence, or this time (ISO) or duration ago."
    ),
    until: str | None = UNTIL,
    control_plane: bool = CONTROL,
    credential_file: Path | None = CREDENTIAL_OPTION,
    nats_url: str | None = NATS_URL_OPTION,
    ca_file: Path | None = CA_FILE_OPTION,
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """Copy the log (your sites, or all with --control-plane) to a file, one event a line.

    With --app, --tag or --until only the jobs they pick are copied, each with all its
    events; pilot sessions, batch jobs, apps and sites are copied whole.
    """
    from lodestream.client.analytics import export_stream, export_watch  # noqa: PLC0415

    selection = _selection(site, app, tag, since, until)
    try:
        if control_plane:
            settings = _control_settings(state_dir)
            written = aio.run(
                _on_control_plane(settings, lambda nc: export_stream(nc, selection, out))
            )
        else:
            access = monitor_access(state_dir, credential_file, nats_url, ca_file)
            sites = check_sites(sorted(selection.sites), access.sites)
            written = aio.run(_with_grace(access.fresh, lambda: export_watch(
                access.credential, sites, selection, out, log_end=access.log_end)))  # fmt: skip
    except LodeClientError as exc:
        print_error(exc)
        raise typer.Exit(1) from exc
    console.print(f"{written:,} events written to {out}")
