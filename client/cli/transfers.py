"""How the CLI shows transfer items (``lode job show``, ``lode site transfers``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from rich.table import Table
from rich.text import Text

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
