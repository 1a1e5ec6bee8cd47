"""``lode token ls|revoke``: your API tokens, by id (never the secret), and revoking one."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from lodestream.client.cli.common import STATE_DIR_OPTION, api_client, console

token_app = typer.Typer(help="Your API tokens: list them, revoke one.", no_args_is_help=True)


@token_app.command("ls")
def token_ls(
    as_json: bool = typer.Option(False, "--json", help="Print the API's JSON."),
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """Your live tokens, oldest first: id, creation time, and which one this client uses."""
    with api_client(state_dir) as client:
        tokens = client.tokens()
    if as_json:
        typer.echo(json.dumps(tokens))
        return
    table = Table("id", "created", "")
    for token in tokens:
        table.add_row(token["id"], str(token["created_at"]), "this one" if token["current"] else "")
    console.print(table)


@token_app.command("revoke")
def token_revoke(
    token_id: str = typer.Argument(..., help="The token's id, as `lode token ls` shows it."),
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """Revoke one of your tokens: every request with it is refused from now on (this
    client's own token too, if you name it)."""
    with api_client(state_dir) as client:
        revoked = client.revoke_token(token_id)
    console.print(f"revoked {revoked['id']} at {revoked['revoked_at']}", highlight=False)
