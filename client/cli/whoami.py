"""``lode whoami`` (who the token is, and whether credential changes take effect) and
``lode doctor`` (an operator's view: which binding the credential sync left out, and why)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from lodestream.client.cli.common import STATE_DIR_OPTION, api_client, console, print_error


def sync_line(state: dict[str, Any] | None) -> str:
    """One line on the credential sync, for every command that shows it."""
    if state is None:
        return "credential sync: not reported (NATS authorization managed outside lode up)"
    line = f"credential sync: {state['state']}"
    if state.get("rejected"):
        line += f", {state['rejected']} binding(s) left out of NATS"
    if state.get("detail"):
        line += f" ({state['detail']})"
    return line


def whoami(
    as_json: bool = typer.Option(False, "--json", help="Print the API's JSON."),
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """Your user name, where your token and API URL came from (and which other source held a
    token it did not use), and the credential sync's state.

    Sources, first wins: LODE_API_URL/LODE_TOKEN, <state dir>/client.json (`lode up`; the
    state dir is --state-dir, LODE_STATE_DIR or ./.lode), ~/.config/lodestream/client.json
    (`lode login`)."""
    with api_client(state_dir) as client:
        me = client.me()
    config = client.config
    if as_json:
        typer.echo(json.dumps({**me, "token_origin": config.origin, "api_url": config.api_url,
                               "api_url_origin": config.url_origin,
                               "unused_tokens": list(config.unused)}))  # fmt: skip
        return
    console.print(f"user: [bold]{me['user']}[/bold] at {config.api_url}", highlight=False)
    console.print(f"token from: {config.origin}", highlight=False, markup=False)
    if config.url_origin != config.origin:
        console.print(f"API URL from: {config.url_origin}", highlight=False, markup=False)
    for where in config.unused:  # shadowed: see lodestream.client.config for the order
        console.print(f"not used: the token in {where} (an earlier source wins)",
                      highlight=False, markup=False)  # fmt: skip
    console.print(sync_line(me.get("credential_sync")), highlight=False, markup=False)
    for reject in me.get("rejected", []):
        what = "site" if reject["kind"] == "site" else "monitoring key of"
        console.print(f"  left out: {what} {reject['holder']}: {reject['reason']}", markup=False)


def doctor(state_dir: Path = STATE_DIR_OPTION) -> None:
    """Check the credential sync: which binding nats-server does not get, and why.

    Reads ``lode up``'s status file in the state dir (every binding left out, with its key);
    without one, asks the API's ``/healthz``. Exits 1 unless the sync is ok.
    """
    status_file = state_dir / "status.json"
    if status_file.exists():
        credentials = json.loads(status_file.read_text()).get("credentials") or {}
        state = str(credentials.get("state", "unknown"))
        console.print(f"credential sync: {state}", highlight=False, markup=False)
        if credentials.get("detail"):
            console.print(f"  {credentials['detail']}", highlight=False, markup=False)
        rejected = credentials.get("rejected") or []
        if rejected:
            table = Table("kind", "holder", "public key", "why it is left out")
            for row in rejected:
                table.add_row(row["kind"], row["holder"], row["public_key"], row["reason"])
            console.print(table)
    else:
        with api_client(state_dir) as client:
            health = client.health()
        state = (health.get("credentials") or {}).get("state", "unknown")
        console.print(sync_line(health.get("credentials")), highlight=False, markup=False)
    if state != "ok":
        print_error(f"credential sync is {state}")
        raise typer.Exit(1)
