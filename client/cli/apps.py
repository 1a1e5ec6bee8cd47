"""``lode app ls``: the applications your sites' agents registered, per site."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from lodestream.client.cli.common import STATE_DIR_OPTION, api_client, console

app_app = typer.Typer(help="Applications defined at your sites (by their site agents).")


@app_app.command("ls")
def app_ls(
    site: str | None = typer.Option(None, "--site", help="Only this site's apps."),
    as_json: bool = typer.Option(False, "--json", help="Print the API's JSON array."),
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """List the apps of your sites: their parameters (with their types), transfer slots,
    versions, and why an app's edited file no longer loads (the site runs the last good one)."""
    with api_client(state_dir) as client:
        apps = client.list_apps(site)
    if as_json:
        typer.echo(json.dumps(apps))
        return
    if not apps:
        console.print(f"no apps registered at {site}" if site else "no apps registered yet",
                      highlight=False)  # fmt: skip
        return
    table = Table("site", "app", "version", "parameters", "transfer slots", "kind", "description")
    for entry in apps:
        error = entry.get("error")
        version = Text(entry.get("version", "")[:12] or "-")
        if error:
            version.append(" (load failed)", style="red")
        table.add_row(
            entry["site"], entry["name"], version, Text(_parameters(entry["parameters"])),
            Text(", ".join(sorted(entry["transfers"]))), "python" if entry["python"] else "shell",
            Text(entry["description"]),
        )  # fmt: skip
    console.print(table)
    for entry in apps:
        if entry.get("error"):
            console.print(Text(f"{entry['site']}/{entry['name']}: {entry['error']}", style="red"))


def _parameters(parameters: dict[str, Any]) -> str:
    """``n:int, label=x, verbose?``: required bare, a default after ``=``, optional with
    ``?``; a declared type other than the app kind's default after ``:``."""
    words = []
    for name, spec in sorted(parameters.items()):
        kind = spec.get("type")
        word = f"{name}:{kind}" if kind not in (None, "str", "any") else name
        if spec.get("default") is not None:
            default = spec["default"]
            words.append(f"{word}={default if isinstance(default, str) else json.dumps(default)}")
        elif spec.get("required", True):
            words.append(word)
        else:
            words.append(f"{word}?")
    return ", ".join(words)
