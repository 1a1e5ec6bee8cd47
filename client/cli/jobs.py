"""``lode job …``: submit, list, inspect, kill and reset jobs as the configured user."""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.progress import MofNCompleteColumn, Progress
from rich.table import Table

from lodestream.client.cli.common import (
    STATE_DIR_OPTION,
    api_client,
    console,
    err_console,
    parse_pairs,
)
from lodestream.client.cli.filters import (
    APP_OPTION,
    PARENT_OPTION,
    SINCE_OPTION,
    SITE_OPTION,
    STATE_OPTION,
    TAG_OPTION,
    JobFilter,
    tag_dict,
)
from lodestream.client.cli.job_results import wait_and_report
from lodestream.client.cli.submitflags import launch_params, transfers, typed_parameters
from lodestream.client.cli.transfers import transfers_table
from lodestream.client.sdk import LodeClient
from lodestream.schemas.ids import short_id
from lodestream.schemas.strategies import DEFAULT_STRATEGY, STRATEGIES

job_app = typer.Typer(help="Submit, list and inspect jobs.")


MAX_CHUNK = 5000  # the API's default api.max_jobs_per_request


@job_app.command("submit")
def job_submit(
    site: str = typer.Option(None, help='Site to run at; "auto" lets lodestream choose.'),
    app: str = typer.Option(None, help="Application name registered at the site."),
    workdir: str = typer.Option(
        None,
        help="Working directory, relative to the site's data/; default: a new one, "
        "runs/<date>-<time>-<6 hex digits>.",
    ),
    param: list[str] = typer.Option([], "--param", "-p", help="Parameter key=value."),
    tag: list[str] = typer.Option([], "--tag", "-t", help="Tag key:value (repeatable)."),
    num_nodes: int = typer.Option(1, min=1),
    ranks_per_node: int = typer.Option(1, min=1),
    threads_per_rank: int = typer.Option(1, min=1),
    gpus_per_rank: int = typer.Option(0, min=0),
    node_packing_count: int = typer.Option(1, min=1, help="How many such jobs may share one node."),
    wall_time_min: int = typer.Option(0, min=0),
    transfer: list[str] = typer.Option(
        [],
        "--transfer",
        "-T",
        help="Stage through an app slot: SLOT=LOCATION:PATH (repeatable).",
    ),
    launch_param: list[str] = typer.Option(
        [],
        "--launch-param",
        "-L",
        help="An app launcher option, as written: -L --cpu-bind=cores, -L --overlap.",
    ),
    strategy: str | None = typer.Option(
        None, help=f"With --site auto: {', '.join(STRATEGIES)} (default {DEFAULT_STRATEGY})."
    ),
    file: Path | None = typer.Option(None, "--file", "-f", help="JSON/YAML list of jobs."),
    chunk_size: int = typer.Option(
        1000, min=1, max=MAX_CHUNK, help="Jobs per request when submitting a file."
    ),
    idempotency_key: str | None = typer.Option(None, help="Make a retried submission a no-op."),
    wait: bool = typer.Option(
        False,
        help="Return once the jobs are accepted and visible in `lode job ls` (not once they "
        "ran: for that, `lode job wait <ids>` or --wait-final).",
    ),
    wait_final: bool = typer.Option(
        False, "--wait-final", help="Then wait until every job is final, as `lode job wait`."
    ),
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """Submit one job from options, or many from --file, in chunks, with a progress bar."""
    if strategy is not None and strategy not in STRATEGIES:
        raise typer.BadParameter(f"--strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
    if file is not None:
        jobs = _load_jobs(file)
    else:
        if not (site and app):
            raise typer.BadParameter("give --site and --app (and --workdir), or --file")
        workdir = workdir or new_workdir()
        with api_client(state_dir) as client:
            declared = _app_of(client, site, app)
        job: dict[str, Any] = {
            "site": site, "app": app, "workdir": workdir,
            "parameters": typed_parameters(parse_pairs(param, "--param"), declared, app),
            "tags": tag_dict(tag), "num_nodes": num_nodes, "ranks_per_node": ranks_per_node,
            "threads_per_rank": threads_per_rank, "gpus_per_rank": gpus_per_rank,
            "node_packing_count": node_packing_count, "wall_time_min": wall_time_min,
            "transfers": transfers(transfer), "launch_params": launch_params(launch_param),
        }  # fmt: skip
        if strategy is not None:
            job["strategy"] = strategy
        jobs = [job]
    with api_client(state_dir) as client:
        submitted = submit_in_chunks(client, jobs, chunk_size, idempotency_key, wait=wait)
    for job in submitted:
        console.print(
            f"{job['id']}  seq {job['seq']}" + ("  (duplicate)" if job["duplicate"] else "")
        )
    if wait_final:
        with api_client(state_dir) as client:
            failed = wait_and_report(client, [str(job["id"]) for job in submitted])
        if failed:
            raise typer.Exit(1)


def _app_of(client: LodeClient, site: str, app: str) -> dict[str, Any] | None:
    """The app's ``GET /apps`` entry (at any of your sites for ``--site auto``), or None."""
    listed = client.list_apps(None if site == "auto" else site)
    return next((a for a in listed if a["name"] == app), None)


def new_workdir() -> str:
    """A workdir no other job has: ``runs/<UTC date>-<time>-<6 hex digits>``."""
    return f"runs/{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def _load_jobs(file: Path) -> list[dict[str, Any]]:
    try:
        loaded = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise typer.BadParameter(f"--file {file}: {exc}") from exc
    jobs = loaded.get("jobs") if isinstance(loaded, dict) else loaded
    if not isinstance(jobs, list) or not all(isinstance(j, dict) for j in jobs):
        raise typer.BadParameter(f"--file {file}: expected a list of jobs (or {{jobs: [...]}})")
    return jobs


def submit_in_chunks(
    client: LodeClient,
    jobs: list[dict[str, Any]],
    chunk_size: int,
    idempotency_key: str | None,
    *,
    wait: bool,
) -> list[dict[str, Any]]:
    """One request per ``chunk_size`` jobs, a bar on stderr advancing as each is accepted
    (with ``wait``: as each is visible in queries). Each chunk's key is derived from
    ``idempotency_key``, so rerunning the same command with the same chunk size is a no-op.

    Parents must be in the same chunk as their children or submitted before them.
    """
    chunks = [jobs[i : i + chunk_size] for i in range(0, len(jobs), chunk_size)]
    done: list[dict[str, Any]] = []
    verb = "submitted, visible" if wait else "submitted"
    with Progress(*Progress.get_default_columns(), MofNCompleteColumn(), console=err_console,
                  transient=True, disable=len(chunks) == 1) as progress:  # fmt: skip
        task = progress.add_task(verb, total=len(jobs))
        for n, chunk in enumerate(chunks):
            key = idempotency_key if idempotency_key is None or len(chunks) == 1 else (
                f"{idempotency_key}/{n}")  # fmt: skip
            done.extend(client.submit_jobs(chunk, idempotency_key=key, wait=wait)["jobs"])
            progress.advance(task, len(chunk))
    return done


@job_app.command("ls")
def job_ls(
    site: str | None = SITE_OPTION,
    app: str | None = APP_OPTION,
    state: list[str] = STATE_OPTION,
    tag: list[str] = TAG_OPTION,
    since: str | None = SINCE_OPTION,
    parent: str | None = PARENT_OPTION,
    limit: int = typer.Option(50, min=1, help="Show at most this many (newest first)."),
    every: bool = typer.Option(False, "--all", help="Show every matching job (no --limit)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per line."),
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """List your jobs, newest first; the id column shows each id's last 8 digits (what
    `lode job show` takes), --json whole ids. A listing cut at --limit says so on stderr."""
    filters = JobFilter.from_options(site, app, state, tag, since, parent)
    table = Table("id", "site", "app", "state", "workdir", "updated")
    shown, more = 0, False
    with api_client(state_dir) as client:
        page_size = 500 if every else min(limit + 1, 500)
        for job in client.list_jobs(page_size=page_size, **filters.params()):
            if not every and shown >= limit:
                more = True
                break
            shown += 1
            if as_json:
                typer.echo(json.dumps(job))
            else:
                table.add_row(short_id(job["id"]), job["site"], job["app"], job["state"],
                              job["workdir"], str(job["updated_at"]))  # fmt: skip
    if not as_json:
        console.print(table)
    if more:
        err_console.print(
            f"showing the newest {limit} jobs; more match: --limit N for more, --all for every "
            "one", highlight=False,
        )  # fmt: skip


@job_app.command("show")
def job_show(
    job_id: str = typer.Argument(
        ..., help="The job's id, or 4+ hex digits it begins or ends with."
    ),
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """Show one job, its transfers (the newest staging step's) and its full event history."""
    with api_client(state_dir) as client:
        job_id = client.resolve_job_id(job_id)
        job = client.get_job(job_id)
        events = client.job_events(job_id)
    items = job.pop("transfer_items", [])  # shown as a table below
    console.print_json(json.dumps(job))
    if items:
        console.print(transfers_table(items))
    table = Table("seq", "type", "from", "to", "actor", "at")
    for event in events:
        table.add_row(
            str(event["seq"]), event["type"], event.get("from_state") or "",
            event.get("to_state") or "", event["actor"], str(event["occurred_at"]),
        )  # fmt: skip
    console.print(table)
