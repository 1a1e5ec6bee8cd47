"""``lode job wait`` and ``lode job result``: until jobs are final, and what they came to.

Waiting reads the jobs' results once (``POST /jobs/results``, which also gives the log
position they were read at), then follows the one feed of your job events from there
(:meth:`LodeClient.follow_events`, pushed) until every job has reached a final state; then
reads the results of those that ended once more, for what to report. However many jobs, it
is one connection and no poll per job.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import typer
from rich.progress import MofNCompleteColumn, Progress
from rich.text import Text

from lodestream.client.cli.common import STATE_DIR_OPTION, api_client, console, err_console
from lodestream.client.cli.filters import TAG_OPTION, parse_tags
from lodestream.client.sdk import LodeClient
from lodestream.schemas.states import FINAL, JobState

RESULTS_PER_REQUEST: Final = 5000  # the API's MAX_RESULT_IDS
FINAL_STATES: Final = frozenset(s.value for s in FINAL)
STDERR_LINES: Final = 20  # of a failed shell job's stderr tail, shown by `lode job wait`


def wait_final(
    client: LodeClient, ids: Sequence[str], settled: Callable[[str, str], None]
) -> list[dict[str, Any]]:
    """Until every job of ``ids`` is final; ``settled(id, state)`` as each one gets there.
    Returns the results (``/jobs/{id}/result`` documents) of every job, in ``ids``' order."""
    results, position = _results(client, ids)
    pending = {r["job_id"] for r in results.values() if not r["final"]}
    for job_id, result in results.items():
        if result["final"]:
            settled(job_id, result["state"])
    if pending:
        for event in client.follow_events(position):
            job_id, to_state = str(event["job_id"]), event.get("to_state")
            if job_id in pending and to_state in FINAL_STATES:
                pending.discard(job_id)
                settled(job_id, str(to_state))
                if not pending:
                    break
        results, _ = _results(client, ids)
    return [results[i] for i in ids]


def _results(client: LodeClient, ids: Sequence[str]) -> tuple[dict[str, dict[str, Any]], int]:
    """Every job's result by id, and the earliest log position they were read at."""
    found: dict[str, dict[str, Any]] = {}
    position: int | None = None
    for start in range(0, len(ids), RESULTS_PER_REQUEST):
        page = client.job_results(ids[start : start + RESULTS_PER_REQUEST])
        if page["missing"]:
            missing = ", ".join(page["missing"][:5])
            raise typer.BadParameter(f"no job of yours has the id {missing}")
        found.update((str(r["job_id"]), r) for r in page["results"])
        position = page["position"] if position is None else min(position, page["position"])
    return found, position or 0


def report_final(results: Iterable[dict[str, Any]]) -> int:
    """Print a line per job that did not finish (with its reason, a Python app's exception or
    the stderr tail); how many of them."""
    failed = [r for r in results if r["state"] != JobState.JOB_FINISHED]
    for result in failed:
        line = f"{result['job_id']} {result['state']}"
        if result.get("reason"):
            line += f": {result['reason']}"
        err_console.print(Text(line, style="bold red"), highlight=False)
        error = result.get("error")
        if error:
            err_console.print(f"  {error['type']}: {error['message']}", highlight=False,
                              markup=False)  # fmt: skip
        elif result.get("stderr_tail"):
            tail = result["stderr_tail"].rstrip().splitlines()[-STDERR_LINES:]
            err_console.print("\n".join(f"  {line}" for line in tail), highlight=False,
                              markup=False)  # fmt: skip
    return len(failed)


def wait_and_report(client: LodeClient, ids: Sequence[str]) -> int:
    """Wait until ``ids`` are final with a bar (a line per job where stderr is no terminal),
    then report those that did not finish; how many of them."""
    done = {"n": 0, "failed": 0}

    if err_console.is_terminal:
        with Progress(*Progress.get_default_columns(), MofNCompleteColumn(),
                      console=err_console, transient=True) as progress:  # fmt: skip
            task = progress.add_task("final", total=len(ids))

            def advance(job_id: str, state: str) -> None:
                done["failed"] += state != JobState.JOB_FINISHED
                progress.update(task, advance=1, description=f"final ({done['failed']} failed)")

            results = wait_final(client, ids, advance)
    else:

        def line(job_id: str, state: str) -> None:
            done["n"] += 1
            err_console.print(f"{done['n']}/{len(ids)} {job_id} {state}", highlight=False)

        results = wait_final(client, ids, line)
    failed = report_final(results)
    finished = len(results) - failed
    summary = f"{len(results)} jobs final: {finished} JOB_FINISHED"
    if failed:
        summary += f", {failed} did not finish (above)"
    console.print(summary, highlight=False)
    return failed


def job_wait(
    job_ids: list[str] | None = typer.Argument(
        None, help="Job ids (or 4+ hex digits one begins or ends with)."
    ),
    tag: list[str] = TAG_OPTION,
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """Wait until every job named (or with every --tag key:value) is final.

    A progress bar on a terminal, a line per job otherwise. Exits 1 if any job ended FAILED
    or KILLED, naming each with its reason, a Python app's exception or its stderr tail.
    """
    if not job_ids and not tag:
        raise typer.BadParameter("name the jobs to wait for, or select them with --tag key:value")
    with api_client(state_dir) as client:
        ids = [client.resolve_job_id(i) for i in job_ids or []]
        if tag:
            ids += [str(j["id"]) for j in client.list_jobs(tag=parse_tags(tag))]
        ids = list(dict.fromkeys(ids))
        if not ids:
            console.print("no job matches")
            return
        failed = wait_and_report(client, ids)
    if failed:
        raise typer.Exit(1)


def job_result(
    job_id: str = typer.Argument(..., help="The job's id, or 4+ hex digits of it."),
    wait: bool = typer.Option(False, "--wait", help="Wait until the job is final first."),
    as_json: bool = typer.Option(False, "--json", help="Print the API's whole result."),
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """What a job came to: a Python app's return value as JSON; for a shell app its state,
    exit code and stderr tail; for a failure the reason and a Python app's exception with its
    traceback. Exits 1 unless the job finished (JOB_FINISHED)."""
    with api_client(state_dir) as client:
        job_id = client.resolve_job_id(job_id)
        if wait:
            [result] = wait_final(client, [job_id], lambda _id, _state: None)
        else:
            result = client.job_result(job_id)
    if as_json:
        typer.echo(json.dumps(result))
    else:
        _print_result(result)
    if result["state"] != JobState.JOB_FINISHED:
        raise typer.Exit(1)


def _print_result(result: dict[str, Any]) -> None:
    if not result["final"]:
        err_console.print(
            f"job {result['job_id']} is {result['state']}, not final yet: "
            f"`lode job result --wait {result['job_id']}` waits for it",
            highlight=False, markup=False,
        )  # fmt: skip
        return
    if result["state"] == JobState.JOB_FINISHED and result.get("result") is not None:
        typer.echo(json.dumps(result["result"]))  # a Python app's value, for a pipe
        return
    print_line = console.print
    print_line(f"state: {result['state']}", highlight=False, markup=False)
    if result.get("return_code") is not None:
        print_line(f"exit code: {result['return_code']}", highlight=False, markup=False)
    if result.get("reason"):
        print_line(f"reason: {result['reason']}", highlight=False, markup=False)
    if result.get("cause"):
        print_line("cause: " + " <- ".join(result["cause"]), highlight=False, markup=False)
    error = result.get("error")
    if error:
        print_line(f"exception: {error['type']}: {error['message']}", highlight=False,
                   markup=False)  # fmt: skip
        print_line(error["traceback"].rstrip(), highlight=False, markup=False)
    elif result.get("stderr_tail"):
        print_line("stderr (tail):", highlight=False, markup=False)
        print_line(result["stderr_tail"].rstrip(), highlight=False, markup=False)
