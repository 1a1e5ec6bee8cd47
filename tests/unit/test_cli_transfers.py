"""How the CLI shows transfer items: sizes, durations, the remote side, why one failed."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
from rich.console import Console

from lodestream.client.cli.transfers import (
    human_bytes,
    human_duration,
    outcome,
    remote,
    transfers_table,
)


def item(**fields: Any) -> dict[str, Any]:
    base = {
        "id": "0193b5c0-0000-7000-8000-000000000001", "job_id": "job-1", "site": "theta",
        "slot": "input", "direction": "in", "location": "archive", "remote_path": "/data/in.h5",
        "recursive": False, "local_path": "runs/1/in.h5", "state": "pending", "attempts": 0,
        "bytes_transferred": None, "duration_s": None, "reason": None, "permanent": False,
        "task_id": None, "step_id": None, "requested_at": None,
        "updated_at": "2026-11-23T20:00:00Z",
    }  # fmt: skip
    return base | fields


@pytest.mark.parametrize(
    ("count", "shown"),
    [
        (None, ""),
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (3_500_000, "3.3 MiB"),
        (5 * 1024**4, "5.0 TiB"),
        (2**63 - 1, "8.0 EiB"),
    ],
)
def test_bytes_in_binary_units(count: int | None, shown: str) -> None:
    assert human_bytes(count) == shown


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(None, ""), (0.0, "0.0s"), (0.42, "0.4s"), (59.9, "59.9s"), (75, "1m15s"),
     (3599, "59m59s"), (7260, "2h01m"), (1e9, "277777h46m")],
)  # fmt: skip
def test_durations(seconds: float | None, shown: str) -> None:
    assert human_duration(seconds) == shown


def test_the_remote_side_marks_a_directory() -> None:
    assert remote(item()) == "archive:/data/in.h5"
    assert remote(item(recursive=True, remote_path="/out")) == "archive:/out/…"
    assert remote(item(recursive=True, remote_path="/out/")) == "archive:/out/"


def test_the_outcome_is_the_reason_or_the_task_in_flight() -> None:
    assert outcome(item()) == ""
    assert outcome(item(state="submitted", task_id="t-9")) == "task t-9"
    assert outcome(item(state="succeeded", task_id="t-9")) == ""
    assert outcome(item(state="failed", reason="quota")) == "quota"
    assert outcome(item(state="failed", reason="gone", permanent=True)) == "gone (permanent)"


def render(*items: dict[str, Any], with_job: bool = False) -> list[list[str]]:
    """The table's header and rows, each as its cells' text."""
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(transfers_table(items, with_job=with_job))
    lines = out.getvalue().splitlines()
    return [[c.strip() for c in re.split("[│┃]", line)[1:-1]] for line in (lines[1], *lines[3:-1])]


def test_a_row_per_item_with_values_shown_literally() -> None:
    header, *rows = render(
        item(remote_path="/cfg/[bold]x[/bold].json"),
        item(slot="results", direction="out", state="failed", attempts=3,
             reason="[Errno 13] denied", permanent=True),
        item(slot="log", state="succeeded", attempts=1, bytes_transferred=2048, duration_s=75),
    )  # fmt: skip

    assert header == ["slot", "dir", "remote", "state", "attempts", "bytes", "duration", "reason"]
    assert rows == [
        ["input", "in", "archive:/cfg/[bold]x[/bold].json", "pending", "0", "", "", ""],
        ["results", "out", "archive:/data/in.h5", "failed", "3", "", "",
         "[Errno 13] denied (permanent)"],
        ["log", "in", "archive:/data/in.h5", "succeeded", "1", "2.0 KiB", "1m15s", ""],
    ]  # fmt: skip


def test_a_site_listing_names_the_job_and_when_it_changed() -> None:
    header, row = render(item(), with_job=True)

    assert (header[0], header[-1]) == ("job", "updated")
    assert (row[0], row[-1]) == ("job-1", "2026-11-23T20:00:00Z")
