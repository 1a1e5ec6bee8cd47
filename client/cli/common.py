"""Shared CLI plumbing: consoles, client construction, error reporting."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.console import Console
from rich.text import Text

from lodestream.client.errors import LodeClientError
from lodestream.client.sdk import LodeClient

console = Console()
err_console = Console(stderr=True, soft_wrap=True)  # paths in errors must stay copyable

STATE_DIR_OPTION = typer.Option(
    Path(".lode"), "--state-dir", envvar="LODE_STATE_DIR", help="Embedded stack state directory."
)


def print_error(message: object) -> None:
    """``error: <message>`` on stderr; the message is shown literally (no rich markup)."""
    err_console.print(Text.assemble(("error: ", "bold red"), str(message)))


@contextmanager
def api_client(state_dir: Path = Path(".lode")) -> Iterator[LodeClient]:
    """A client from flags/env/client files; exits with a clear message on API errors."""
    try:
        with LodeClient.from_config(state_dir=state_dir) as client:
            yield client
    except LodeClientError as exc:
        print_error(exc)
        raise typer.Exit(1) from exc


def parse_pairs(pairs: list[str], what: str) -> dict[str, str]:
    """``["k=v", ...]`` → dict, with a usage error naming the bad pair."""
    result: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{what} must look like key=value, got {pair!r}")
        result[key] = value
    return result
