"""``lode job kill|reset``: of the jobs named, or of every job a filter selects.

Jobs named without a filter are acted on one request each, so each refusal says why
(already final, not found). A filter (the same as ``lode job ls``) goes to the API whole
(``POST /jobs/kill``, ``/jobs/reset``): the jobs it selects are counted (a dry run),
confirmed (or ``--yes``), then acted on in one request per ``api.max_jobs_per_request``
jobs. A job that changed meanwhile and can no longer be acted on is reported, not fatal.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.progress import MofNCompleteColumn, Progress

from lodestream.client.cli.common import STATE_DIR_OPTION, api_client, console, err_console
from lodestream.client.cli.filters import (
    APP_OPTION,
    PARENT_OPTION,
    SINCE_OPTION,
    SITE_OPTION,
    STATE_OPTION,
    TAG_OPTION,
    JobFilter,
)
from lodestream.client.errors import ApiError
from lodestream.client.sdk import LodeClient

IDS_ARGUMENT = typer.Argument(
    None, help="Job ids (or 4+ hex digits one begins or ends with); or select with the filters."
)
YES_OPTION = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation.")
REASON_OPTION = typer.Option("", help="Recorded in each job's history.")


def job_kill(
    job_ids: list[str] | None = IDS_ARGUMENT,
    site: str | None = SITE_OPTION,
    app: str | None = APP_OPTION,
    state: list[str] = STATE_OPTION,
    tag: list[str] = TAG_OPTION,
    since: str | None = SINCE_OPTION,
    parent: str | None = PARENT_OPTION,
    reason: str = REASON_OPTION,
    yes: bool = YES_OPTION,
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """Kill jobs that are not final; a running task is stopped by its pilot."""
    filters = JobFilter.from_options(site, app, state, tag, since, parent)
    _act("kill", job_ids or [], filters, reason, yes, state_dir)


def job_reset(
    job_ids: list[str] | None = IDS_ARGUMENT,
    site: str | None = SITE_OPTION,
    app: str | None = APP_OPTION,
    state: list[str] = STATE_OPTION,
    tag: list[str] = TAG_OPTION,
    since: str | None = SINCE_OPTION,
    parent: str | None = PARENT_OPTION,
    reason: str = REASON_OPTION,
    yes: bool = YES_OPTION,
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """Send FAILED or KILLED jobs back to READY."""
    filters = JobFilter.from_options(site, app, state, tag, since, parent)
    _act("reset", job_ids or [], filters, reason, yes, state_dir)


def _act(
    verb: str,
    ids: list[str],
    filters: JobFilter,
    reason: str,
    yes: bool,
    state_dir: Path,
) -> None:
    """Named jobs without a filter are acted on as named; with a filter, the jobs it selects
    (in the states the action applies to unless it names states), after a confirmation."""
    if not ids and filters.empty:
        raise typer.BadParameter(
            f"name the jobs to {verb}, or select them with --site, --app, --state, --tag, "
            "--since or --parent"
        )
    with api_client(state_dir) as client:
        targets = [client.resolve_job_id(i) for i in ids]
        if filters.empty:
            action: Callable[[str, str], dict[str, Any]] = (
                client.kill_job if verb == "kill" else client.reset_job
            )
            failed = _apply(verb, action, targets, reason)
        else:
            failed = _bulk(client, verb, targets, filters, reason, yes)
    if failed:
        raise typer.Exit(1)


def _bulk(
    client: LodeClient, verb: str, ids: list[str], filters: JobFilter, reason: str, yes: bool
) -> int:
    """Act on what the filter selects (among ``ids`` when some are named) through the bulk
    route, request after request while it says there is more; how many were refused."""
    bulk = client.kill_jobs if verb == "kill" else client.reset_jobs
    selection = filters.selection(ids)
    counted = bulk(dry_run=True, **selection)
    if not counted["matched"]:
        console.print(f"no job to {verb} matches")
        return 0
    more = "+" if counted["more"] else ""
    if not yes and not typer.confirm(f"{verb} {counted['matched']}{more} jobs?", err=True):
        raise typer.Exit(1)
    acted = refused = 0
    while True:
        done = bulk(reason=reason, **selection)
        acted += int(done["acted"])
        refused += int(done["refused"])
        for refusal in done["refusals"]:
            err_console.print(f"{refusal['id']}: not {verb}: {refusal['reason']}", highlight=False)
        if not done["more"] or not done["acted"]:
            break
    state = "KILLED" if verb == "kill" else "READY"
    console.print(f"{acted} jobs {state}" + (f", {refused} refused" if refused else ""))
    return refused


def _apply(
    verb: str, action: Callable[[str, str], dict[str, Any]], ids: list[str], reason: str
) -> int:
    failed = 0
    with Progress(*Progress.get_default_columns(), MofNCompleteColumn(), console=err_console,
                  transient=True, disable=len(ids) == 1) as progress:  # fmt: skip
        task = progress.add_task(f"{verb}ing", total=len(ids))
        for job_id in ids:
            try:
                result = action(job_id, reason)
            except ApiError as exc:  # gone, or moved on meanwhile: say so, go on
                failed += 1
                progress.console.print(f"{job_id}: not {verb}: {exc}", highlight=False)
            else:
                console.print(f"{job_id}: {result['state']}", highlight=False)
            progress.advance(task)
    return failed
