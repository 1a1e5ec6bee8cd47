"""``lode job kill|reset``: of the jobs named, or of every job a filter selects.

The API acts on one job per request, so a filter is resolved here: the jobs
it lists (``GET /jobs``, the same filters as ``lode job ls``) are shown by
count and, once confirmed (or with ``--yes``), acted on one by one with a
progress bar. A job that changed meanwhile and can no longer be acted on is
reported and skipped, not fatal.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

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
from lodestream.schemas.states import FINAL, NON_FINAL, JobState

# What each action can apply to: a filter without --state is limited to these.
KILLABLE: Final = sorted(s.value for s in NON_FINAL)
RESETTABLE: Final = sorted(s.value for s in FINAL if s is not JobState.JOB_FINISHED)
MAX_SELECTED: Final = 100_000

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
    _act("kill", job_ids or [], filters, KILLABLE, reason, yes, state_dir)


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
    _act("reset", job_ids or [], filters, RESETTABLE, reason, yes, state_dir)


def _act(
    verb: str,
    ids: list[str],
    filters: JobFilter,
    applicable: list[str],
    reason: str,
    yes: bool,
    state_dir: Path,
) -> None:
    """Named jobs without a filter are acted on as named; with a filter, the jobs it selects
    (in ``applicable`` states unless it names states), after a confirmation."""
    if not ids and filters.empty:
        raise typer.BadParameter(
            f"name the jobs to {verb}, or select them with --site, --app, --state, --tag, "
            "--since or --parent"
        )
    with api_client(state_dir) as client:
        action: Callable[[str, str], dict[str, Any]] = (
            client.kill_job if verb == "kill" else client.reset_job
        )
        targets = [client.resolve_job_id(i) for i in ids]
        if not filters.empty:
            targets = _select(client, targets, filters.with_default_states(applicable))
            if not targets:
                console.print(f"no job to {verb} matches")
                return
            if not yes and not typer.confirm(f"{verb} {len(targets)} jobs?", err=True):
                raise typer.Exit(1)
        failed = _apply(verb, action, targets, reason)
    if failed:
        raise typer.Exit(1)


def _select(client: LodeClient, ids: list[str], filters: JobFilter) -> list[str]:
    """The jobs the filter lists, among ``ids`` when some are named too."""
    wanted = set(ids)
    selected = []
    for job in client.list_jobs(**filters.params()):
        if not wanted or job["id"] in wanted:
            selected.append(job["id"])
        if len(selected) >= MAX_SELECTED:
            break
    return selected


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
