"""``lode analytics simulate``: what if the same run had had other capacity, routing or
storage (a discrete-event model calibrated on the run; :mod:`lodestream.client.analytics.simulate`).

Registered on the ``lode analytics`` group by :mod:`lodestream.client.cli.analytics`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from lodestream.client.cli.common import STATE_DIR_OPTION, api_client, console, print_error
from lodestream.client.cli.filters import parse_since, parse_tag
from lodestream.schemas.strategies import STRATEGIES

# The model is imported when the command runs: every `lode` command imports this module
# to register it, and the analytics package took about half a second of each one's start.
if TYPE_CHECKING:
    from lodestream.client.analytics.simulate.calibrate import IOModel
    from lodestream.client.analytics.simulate.source import Refusals
    from lodestream.client.analytics.simulate.whatif import WhatIf
    from lodestream.schemas.envelope import Event


def simulate(
    from_file: Path | None = typer.Option(
        None,
        "--from-file",
        help="Events as JSON lines (the log's envelopes or `lode events "
        "--json` rows); without it, your events from the API.",
        dir_okay=False,
    ),
    site: list[str] = typer.Option([], "--site", help="Only jobs at this site (repeatable)."),
    since: str | None = typer.Option(
        None, "--since", help="Only jobs created since: a duration (10m) or a time."
    ),
    until: str | None = typer.Option(
        None, "--until", help="Only jobs created until: a duration (10m ago) or a time."
    ),
    app_names: list[str] = typer.Option([], "--app", help="Only jobs of this app (repeatable)."),
    tag: list[str] = typer.Option(
        [], "--tag", "-t", help="Only jobs with tag key:value (repeatable)."
    ),
    pilots_times: int | None = typer.Option(
        None, "--pilots-times", help="Each site's recorded pilots, this many times over."
    ),
    jobs_times: int | None = typer.Option(
        None, "--jobs-times", help="The workload submitted this many times (its DAGs too)."
    ),
    arrival_rate: float | None = typer.Option(
        None, "--arrival-rate", help="Submissions re-spaced at this many a second."
    ),
    bandwidth_times: float | None = typer.Option(
        None, "--bandwidth-times", help="The storage tier this many times as fast."
    ),
    speed: float | None = typer.Option(
        None, "--speed", help="Runs this many times as fast (another site's speed ratio)."
    ),
    pilots: int | None = typer.Option(None, "--pilots", help="Pilots per site."),
    nodes: int | None = typer.Option(None, "--nodes", help="Nodes per pilot."),
    slots: int | None = typer.Option(None, "--slots", help="Slots per node (jobs at once)."),
    strategy: str | None = typer.Option(
        None, "--strategy", help=f"Route every job across the sites: {', '.join(STRATEGIES)}."
    ),
    bandwidth: float | None = typer.Option(
        None, "--bandwidth", help="Bandwidth (bytes/s) of the storage tasks read, shared."
    ),
    io_fraction: float | None = typer.Option(
        None, "--io-fraction", help="The fraction of each recorded run that was I/O."
    ),
    recorded_bandwidth: float | None = typer.Option(
        None, "--recorded-bandwidth", help="The bandwidth (bytes/s) the recorded run read at."
    ),
    nodes_per_job: int | None = typer.Option(None, "--nodes-per-job", help="Nodes each job."),
    parallel_fraction: float = typer.Option(
        1.0, "--parallel-fraction", help="Amdahl: the part of compute that spreads over nodes."
    ),
    elastic_max_nodes: int | None = typer.Option(
        None, "--elastic-max-nodes", help="Replay the elastic queue's decisions with this max."
    ),
    elastic_min_nodes: int | None = typer.Option(None, "--elastic-min-nodes"),
    elastic_max_queued: int | None = typer.Option(None, "--elastic-max-queued-jobs"),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """Predict makespan and throughput of a recorded run under another capacity.

    The run's structure is replayed (parents, attempts and their backoff, staging as its
    steps took); the pilots' shape comes from their session.opened events.
    """
    from lodestream.client.analytics.simulate.errors import SimulationError  # noqa: PLC0415
    from lodestream.client.analytics.simulate.model import Scenario  # noqa: PLC0415
    from lodestream.client.analytics.simulate.source import Refusals  # noqa: PLC0415
    from lodestream.client.analytics.simulate.whatif import what_if  # noqa: PLC0415

    moment = parse_since(since) if since else None
    end = parse_since(until) if until else None
    tags = dict(parse_tag(t) for t in tag)
    elastic = {k: v for k, v in (("max_nodes", elastic_max_nodes), ("min_nodes", elastic_min_nodes),
               ("max_queued_jobs", elastic_max_queued)) if v is not None}  # fmt: skip
    refusals = Refusals()
    try:
        scenario = Scenario(pilots=pilots, nodes=nodes, slots=slots, strategy=strategy,  # type: ignore[arg-type]
                            bandwidth=bandwidth, nodes_per_job=nodes_per_job,
                            parallel_fraction=parallel_fraction, pilots_factor=pilots_times,
                            jobs_factor=jobs_times, arrival_rate=arrival_rate,
                            bandwidth_factor=bandwidth_times, speed=speed)  # fmt: skip
        io = _io_model(io_fraction, recorded_bandwidth)
        events = _events(from_file, site, state_dir, refusals)
        result = what_if(events, scenario, since=moment, until=end, apps=app_names, tags=tags,
                         io=io, scaler_changes=elastic)  # fmt: skip
    except SimulationError as exc:
        print_error(exc)
        raise typer.Exit(1) from exc
    if as_json:
        typer.echo(json.dumps({**result.to_json(), "refused_events": refusals.count}))
        return
    _print(result, refusals)


def _events(
    from_file: Path | None, sites: list[str], state_dir: Path, refusals: Refusals
) -> list[Event]:
    from lodestream.client.analytics.simulate.errors import SimulationError  # noqa: PLC0415
    from lodestream.client.analytics.simulate.source import from_feed, from_lines  # noqa: PLC0415

    if from_file is not None:
        with _lines(from_file) as lines:
            events = [e for e in from_lines(lines, refusals) if _at(e, sites)]
    else:
        with api_client(state_dir) as client:
            rows = client.follow_events(0, until_caught_up=True)
            events = [e for e in from_feed(rows, refusals) if _at(e, sites)]
    if not events:
        refused = f" ({refusals.count} refused: {refusals.first})" if refusals.count else ""
        raise SimulationError(f"no events in the range given{refused}")
    return events


def _io_model(fraction: float | None, bandwidth: float | None) -> IOModel | None:
    from lodestream.client.analytics.simulate.calibrate import IOModel  # noqa: PLC0415
    from lodestream.client.analytics.simulate.errors import SimulationError  # noqa: PLC0415

    if fraction is None and bandwidth is None:
        return None
    if fraction is None or bandwidth is None:
        raise SimulationError("an I/O model needs both --io-fraction and --recorded-bandwidth")
    return IOModel(fraction, bandwidth)


class _lines:  # noqa: N801 - reads as the context manager it is
    """The file's lines, or a clear error if it cannot be read."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def __enter__(self) -> Iterator[bytes]:
        from lodestream.client.analytics.simulate.errors import SimulationError  # noqa: PLC0415

        try:
            self._file = self._path.open("rb")
        except OSError as exc:
            raise SimulationError(f"cannot read {self._path}: {exc.strerror}") from exc
        return iter(self._file)

    def __exit__(self, *exc: object) -> None:
        self._file.close()


def _at(event: Event, sites: list[str]) -> bool:
    return not sites or event.site in sites


def _print(result: WhatIf, refusals: Refusals) -> None:
    cal = result.calibration
    table = Table(title=f"{len(cal.jobs)} jobs; capacity from {cal.capacity_source}")
    for column in ("", "makespan (s)", "throughput (jobs/s)", "mean wait (s)"):
        table.add_column(column, justify="right" if column else "left")
    table.add_row("recorded", f"{cal.makespan_s:.3f}", f"{cal.throughput_per_s:.3f}", "")
    for name, p in (("replayed at recorded capacity", result.baseline),
                    ("predicted", result.predicted)):  # fmt: skip
        table.add_row(name, f"{p.makespan_s:.3f}", f"{p.throughput_per_s:.3f}",
                      f"{p.mean_wait_s:.3f}")  # fmt: skip
    console.print(table)
    for site, change in result.capacity.items():
        console.print(f"site {site}: {change}", highlight=False)
    stages = ", ".join(f"{k} {v:.3f}" for k, v in cal.stages.items())
    console.print(f"stage medians (s): {stages}", highlight=False)
    if result.unfinished:
        console.print(f"{result.unfinished} job(s) never finished: not replayed")
    if refusals.count:
        console.print(f"{refusals.count} event(s) refused and skipped; first: {refusals.first}")
    if result.scaler is not None:
        s = result.scaler
        console.print(
            f"elastic queue, {s.decisions} decision(s) replayed: {s.recorded_jobs} batch "
            f"job(s) / {s.recorded_nodes} node(s) requested → {s.replayed_jobs} / "
            f"{s.replayed_nodes}; deletions {s.recorded_deletions} → {s.replayed_deletions}",
            highlight=False,
        )
