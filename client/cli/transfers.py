"""``lode site transfers``, and how the CLI shows transfer items (there and in ``lode job
show``)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

import typer
from rich.table import Table
from rich.text import Text

from lodestream.client.cli.common import STATE_DIR_OPTION, api_client, console

BYTE_UNITS: Final = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
STATE_STYLES: Final = {"failed": "red", "succeeded": "green", "submitted": "cyan"}


def human_bytes(count: int | None) -> str:
    """``1536`` → ``1.5 KiB``; empty when the count is not known (not moved yet)."""
    if count is None:
        return ""
    value = float(count)
    for unit in BYTE_UNITS[:-1]:
        if value < 1024:
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} {BYTE_UNITS[-1]}"


def human_duration(seconds: float | None) -> str:
    """``0.42`` → ``0.4s``, ``75`` → ``1m15s``, ``7260`` → ``2h01m``; empty when unknown."""
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def remote(item: dict[str, Any]) -> str:
    """``location:path``, with a trailing ``/…`` for a recursive (directory) transfer."""
    suffix = "/…" if item.get("recursive") and not item["remote_path"].endswith("/") else ""
    return f"{item['location']}:{item['remote_path']}{suffix}"


def outcome(item: dict[str, Any]) -> str:
    """Why it failed (and whether retrying could help), or the backend's task while in flight."""
    if item.get("reason"):
        return str(item["reason"]) + (" (permanent)" if item.get("permanent") else "")
    if item["state"] == "submitted" and item.get("task_id"):
        return f"task {item['task_id']}"
    if item.get("cached"):
        return "from the site's stage cache"
    return ""


def transfers_table(items: Iterable[dict[str, Any]], *, with_job: bool = False) -> Table:
    """One row per item. Every value from the API is shown as plain text: a path or a reason
    may hold ``[`` and must not be read as rich markup."""
    columns = ["slot", "dir", "remote", "state", "attempts", "bytes", "duration", "reason"]
    table = Table(*(["job", *columns, "updated"] if with_job else columns))
    for item in items:
        state = Text(item["state"], style=STATE_STYLES.get(item["state"], ""))
        cells = [
            Text(item["slot"]), item["direction"], Text(remote(item)), state,
            str(item["attempts"]), human_bytes(item.get("bytes_transferred")),
            human_duration(item.get("duration_s")), Text(outcome(item)),
        ]  # fmt: skip
        if with_job:
            cells = [item["job_id"], *cells, str(item["updated_at"])]
        table.add_row(*cells)
    return table


def site_transfers(
    name: str = typer.Argument(..., help="Site name."),
    state: list[str] = typer.Option(
        [], help="pending, submitted, succeeded or failed (repeatable); default: in flight."
    ),
    direction: str | None = typer.Option(None, help="in (stage-in) or out (stage-out)."),
    job: str | None = typer.Option(None, "--job", help="Only this job's items, every step's."),
    limit: int = typer.Option(100, min=1, max=1000),
    as_json: bool = typer.Option(False, "--json", help="Print the API's JSON array."),
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """List a site's transfer items, most recently changed first: those in flight by default."""
    with api_client(state_dir) as client:
        items = client.site_transfers(
            name, state=state, direction=direction, job_id=job, limit=limit
        )
    if as_json:
        typer.echo(json.dumps(items))
    elif not items:
        what = "transfer items match" if state or job else "transfers are in flight"
        console.print(f"no {what} at {name}", highlight=False)
    else:
        console.print(transfers_table(items, with_job=True))
