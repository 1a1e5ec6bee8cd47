"""``lode queue ls|submit|rm``: pilot batch jobs at your sites, as the configured user."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from lodestream.client.cli.common import STATE_DIR_OPTION, api_client, console, parse_pairs
from lodestream.client.cli.filters import tag_dict

queue_app = typer.Typer(help="Pilot batch jobs: ask a site for pilots, watch them, delete them.")


@queue_app.command("ls")
def queue_ls(
    site: str | None = typer.Option(None, help="Only this site's batch jobs."),
    state: list[str] = typer.Option([], help="Filter by state (repeatable)."),
    limit: int = typer.Option(50, min=1, max=1000),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON array."),
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """List your batch jobs, newest first: state, the scheduler's id, what a queued one waits
    for (the scheduler's pending reason) and how each ended."""
    with api_client(state_dir) as client:
        batch_jobs = client.list_batch_jobs(site, state=state, limit=limit)
    if as_json:
        typer.echo(json.dumps(batch_jobs))
        return
    table = Table("id", "site", "state", "scheduler id", "nodes", "wall min", "queue", "mode",
                  "waiting for", "ended", "updated")  # fmt: skip
    for job in batch_jobs:
        table.add_row(
            job["id"], job["site"], job["state"], _scheduler_id(job), str(job["num_nodes"]),
            str(job["wall_time_min"]), job["queue"], job["job_mode"], _waiting(job), _ended(job),
            str(job["updated_at"]),
        )  # fmt: skip
    console.print(table)


def _scheduler_id(job: dict[str, Any]) -> str:
    if not job.get("scheduler_id"):
        return ""
    return f"{job['scheduler']} {job['scheduler_id']}" if job.get("scheduler") else job[
        "scheduler_id"]  # fmt: skip


def _waiting(job: dict[str, Any]) -> str:
    """Why the scheduler has not started it yet, in its words (Slurm's pending reason)."""
    return str(job.get("reason") or "") if job["state"] == "queued" else ""


def _ended(job: dict[str, Any]) -> str:
    """How it ended: the scheduler's state and exit code, or why it was never submitted."""
    words = [job.get("scheduler_state") or ""]
    if job.get("exit_code") is not None:
        words.append(f"exit {job['exit_code']}")
    if job.get("reason") and job["state"] in {"finished", "submit_failed"}:
        words.append(job["reason"])
    return " ".join(w for w in words if w)


@queue_app.command("submit")
def queue_submit(
    site: str = typer.Option(..., help="Site to run the pilot at."),
    num_nodes: int = typer.Option(1, "--num-nodes", "-n", min=1),
    wall_time_min: int = typer.Option(..., "--wall-time-min", "-t", min=1),
    queue: str = typer.Option("", help="Scheduler queue (partition); the site's default if empty."),
    project: str = typer.Option("", help="Project (account) to charge; the site's default."),
    mode: str = typer.Option("serial", "--mode", help="Pilot mode: serial or mpi."),
    tag: list[str] = typer.Option([], "--tag", help="Run only jobs with tag key:value."),
    option: list[str] = typer.Option(
        [], "--option", "-o", help="Scheduler option name=value (repeatable)."
    ),
    idempotency_key: str | None = typer.Option(None, help="Make a retried request a no-op."),
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """Ask a site for a pilot batch job; the site's agent submits it to its scheduler."""
    if mode not in {"serial", "mpi"}:
        raise typer.BadParameter("mode must be serial or mpi")
    with api_client(state_dir) as client:
        result = client.request_batch_job(
            site, num_nodes=num_nodes, wall_time_min=wall_time_min, queue=queue,
            project=project, job_mode=mode, filter_tags=tag_dict(tag),
            options=parse_pairs(option, "--option"), idempotency_key=idempotency_key,
        )  # fmt: skip
    console.print(f"{result['id']}  {result['state']}  seq {result['seq']}"
                  + ("  (duplicate)" if result.get("duplicate") else ""))  # fmt: skip


@queue_app.command("rm")
def queue_rm(
    batch_id: str = typer.Argument(..., help="Batch job id (from `lode queue ls`)."),
    reason: str = typer.Option("", help="Recorded with the deletion request."),
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """Delete a batch job: the site cancels it at its scheduler, its pilot drains."""
    with api_client(state_dir) as client:
        result = client.delete_batch_job(batch_id, reason)
    console.print(f"{batch_id}: {result['state']}")
