"""``lode job …``: submit, list, inspect, kill and reset jobs as the configured user."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.table import Table

from lodestream.client.cli.common import STATE_DIR_OPTION, api_client, console, parse_pairs
from lodestream.client.cli.transfers import transfers_table

job_app = typer.Typer(help="Submit, list and inspect jobs.")


@job_app.command("submit")
def job_submit(
    site: str = typer.Option(None, help="Site to run at."),
    app: str = typer.Option(None, help="Application name registered at the site."),
    workdir: str = typer.Option(None, help="Working directory, relative to the site's data/."),
    param: list[str] = typer.Option([], "--param", "-p", help="Parameter key=value."),
    tag: list[str] = typer.Option([], "--tag", "-t", help="Tag key=value."),
    num_nodes: int = typer.Option(1, min=1),
    ranks_per_node: int = typer.Option(1, min=1),
    wall_time_min: int = typer.Option(0, min=0),
    file: Path | None = typer.Option(None, "--file", "-f", help="JSON/YAML list of jobs."),
    idempotency_key: str | None = typer.Option(None, help="Make a retried submission a no-op."),
    wait: bool = typer.Option(False, help="Return once the jobs are visible in queries."),
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """Submit one job from options, or a batch from --file."""
    if file is not None:
        loaded = yaml.safe_load(file.read_text())
        jobs: list[dict[str, Any]] = loaded if isinstance(loaded, list) else loaded["jobs"]
    else:
        if not (site and app and workdir):
            raise typer.BadParameter("give --site, --app and --workdir, or --file")
        jobs = [{
            "site": site, "app": app, "workdir": workdir,
            "parameters": parse_pairs(param, "--param"), "tags": parse_pairs(tag, "--tag"),
            "num_nodes": num_nodes, "ranks_per_node": ranks_per_node,
            "wall_time_min": wall_time_min,
        }]  # fmt: skip
    with api_client(state_dir) as client:
        result = client.submit_jobs(jobs, idempotency_key=idempotency_key, wait=wait)
    for job in result["jobs"]:
        console.print(
            f"{job['id']}  seq {job['seq']}" + ("  (duplicate)" if job["duplicate"] else "")
        )


@job_app.command("ls")
def job_ls(
    site: str | None = None,
    app: str | None = None,
    state: list[str] = typer.Option([], help="Filter by state (repeatable)."),
    tag: list[str] = typer.Option([], help="Filter by tag key:value (repeatable)."),
    limit: int = typer.Option(50, min=1),
    as_json: bool = typer.Option(False, "--json", help="Print JSON lines."),
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """List your jobs, newest first."""
    filters: dict[str, Any] = {k: v for k, v in {"site": site, "app": app}.items() if v}
    if state:
        filters["state"] = state
    if tag:
        filters["tag"] = tag
    table = Table("id", "site", "app", "state", "workdir", "updated")
    with api_client(state_dir) as client:
        for n, job in enumerate(client.list_jobs(page_size=min(limit, 500), **filters)):
            if n >= limit:
                break
            if as_json:
                console.print_json(json.dumps(job))
            else:
                table.add_row(job["id"], job["site"], job["app"], job["state"], job["workdir"],
                              str(job["updated_at"]))  # fmt: skip
    if not as_json:
        console.print(table)


@job_app.command("show")
def job_show(job_id: str, state_dir: Path = STATE_DIR_OPTION) -> None:
    """Show one job, its transfers (the newest staging step's) and its full event history."""
    with api_client(state_dir) as client:
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


@job_app.command("kill")
def job_kill(job_id: str, reason: str = "", state_dir: Path = STATE_DIR_OPTION) -> None:
    """Kill a job that is not final; a running task is stopped by its pilot."""
    with api_client(state_dir) as client:
        result = client.kill_job(job_id, reason)
    console.print(f"{job_id}: {result.get('state', 'KILLED')}")


@job_app.command("reset")
def job_reset(job_id: str, reason: str = "", state_dir: Path = STATE_DIR_OPTION) -> None:
    """Send a FAILED or KILLED job back to READY."""
    with api_client(state_dir) as client:
        result = client.reset_job(job_id, reason)
    console.print(f"{job_id}: {result.get('state', 'READY')}")
