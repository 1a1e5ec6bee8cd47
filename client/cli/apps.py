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
    """List the apps of your sites: their parameters and transfer slots."""
    with api_client(state_dir) as client:
        apps = client.list_apps(site)
    if as_json:
        typer.echo(json.dumps(apps))
        return
    if not apps:
        console.print(f"no apps registered at {site}" if site else "no apps registered yet",
                      highlight=False)  # fmt: skip
        return
    table = Table("site", "app", "parameters", "transfer slots", "kind", "description")
    for entry in apps:
        table.add_row(
            entry["site"], entry["name"], Text(_parameters(entry["parameters"])),
            Text(", ".join(sorted(entry["transfers"]))), "python" if entry["python"] else "shell",
            Text(entry["description"]),
        )  # fmt: skip
    console.print(table)


def _parameters(parameters: dict[str, Any]) -> str:
    """``n, label=x, verbose?``: required bare, a default after ``=``, optional with ``?``."""
    words = []
    for name, spec in sorted(parameters.items()):
        if spec.get("default") is not None:
            words.append(f"{name}={spec['default']}")
        elif spec.get("required", True):
            words.append(name)
        else:
            words.append(f"{name}?")
    return ", ".join(words)
