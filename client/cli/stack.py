"""``lode up``: the embedded stack in the foreground, optionally with the demo workload."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from types import FrameType

import typer
from rich.table import Table

from client.cli.common import STATE_DIR_OPTION, console, err_console
from client.config import ClientConfig
from client.demo import run_demo
from client.sdk import LodeClient
from lodestream.embedded import EmbeddedStack, StackInfo, StackPorts


def up(
    state_dir: Path = STATE_DIR_OPTION,
    demo: bool = typer.Option(False, help="Submit the demo workload once the stack is up."),
    demo_jobs: int = typer.Option(200, min=1, max=5000, help="Jobs in the demo batch."),
    exit_after_demo: bool = typer.Option(False, help="Stop the stack when the demo is done."),
    user: str | None = typer.Option(None, help="Local API user (default: your login name)."),
    nats_port: int = typer.Option(14222, help="NATS client port (loopback)."),
    websocket_port: int = typer.Option(14443, help="NATS wss:// port for sites (loopback)."),
    postgres_port: int = typer.Option(15432, help="Postgres port (loopback)."),
    api_port: int = typer.Option(8400, help="API port (loopback)."),
) -> None:
    """Start nats-server, Postgres, migrations, streams, api and projector; Ctrl-C stops all."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    ports = StackPorts(
        nats=nats_port, websocket=websocket_port, nats_http=nats_port + 4000,
        postgres=postgres_port, api=api_port,
    )  # fmt: skip
    stack = EmbeddedStack(state_dir, ports)
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        with console.status("starting nats-server, Postgres, api and projector…"):
            info = stack.start(user)
        _print_info(info)
        if demo:
            _demo(info, demo_jobs)
            if exit_after_demo:
                return
        console.print("[dim]stack running — Ctrl-C to stop[/dim]")
        while not stop.wait(1.0):
            stack.supervise_once()
    except Exception as exc:
        err_console.print(f"[red]lode up failed:[/red] {exc}")
        raise typer.Exit(1) from exc
    finally:
        with console.status("stopping…"):
            stack.stop()
        console.print("stopped; state kept in", str(state_dir))


def _print_info(info: StackInfo) -> None:
    table = Table(title="lodestream embedded stack", show_header=False)
    table.add_row("API", info.api_url)
    table.add_row("user / token", f"{info.user} / {info.token}")
    table.add_row("NATS (control plane)", f"{info.nats_url}  user {info.control_user}")
    table.add_row("NATS (sites, wss)", f"{info.websocket_url}  CA {info.ca_file}")
    table.add_row("Postgres", info.database_url)
    table.add_row("state", str(info.state_dir))
    console.print(table)


def _demo(info: StackInfo, count: int) -> None:
    with LodeClient(ClientConfig(info.api_url, info.token)) as client:
        report = run_demo(client, count)
    rate = report.submitted / report.submit_seconds if report.submit_seconds else 0.0
    console.print(
        f"demo: submitted {report.submitted} jobs and saw them projected in "
        f"{report.submit_seconds * 1000:.0f} ms ({rate:,.0f} jobs/s)"
    )
    table = Table("state", "jobs", title=f"jobs tagged {report.batch_tag}")
    for state, n in sorted(report.states.items()):
        table.add_row(state, str(n))
    console.print(table)
    console.print(f"try: lode job ls --tag {report.batch_tag}")
