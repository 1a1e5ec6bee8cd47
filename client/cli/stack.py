"""``lode up``: the embedded stack in the foreground, optionally with the demo workload."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from lodestream.client.cli.common import STATE_DIR_OPTION, console, err_console
from lodestream.client.config import ClientConfig
from lodestream.client.errors import ApiError
from lodestream.client.sdk import LodeClient

if TYPE_CHECKING:
    from lodestream.services.embedded import EmbeddedStack, StackInfo

# The stack (Postgres, alembic, SQLAlchemy, the services) is imported only by `lode up`: every
# `lode` command imports this module, and a pilot (`lode launcher`) starts seconds sooner
# without it.

log = logging.getLogger(__name__)


def up(
    state_dir: Path = STATE_DIR_OPTION,
    demo: bool = typer.Option(False, help="Submit the demo workload once the stack is up."),
    demo_jobs: int = typer.Option(200, min=1, max=5000, help="Jobs in the demo batch."),
    exit_after_demo: bool = typer.Option(False, help="Stop the stack when the demo is done."),
    user: str | None = typer.Option(None, help="Local API user (default: your login name)."),
    nats_port: int = typer.Option(14222, help="NATS client port (loopback)."),
    websocket_port: int = typer.Option(14443, help="NATS wss:// port for sites (loopback)."),
    monitor_port: int | None = typer.Option(
        None, help="nats-server monitoring port (loopback); unset: the NATS port + 4000."
    ),
    postgres_port: int = typer.Option(15432, help="Postgres port (loopback)."),
    api_port: int = typer.Option(8400, help="API port (loopback)."),
) -> None:
    """Start nats-server, Postgres, migrations, streams, api and projector; Ctrl-C stops all."""
    from lodestream.client.demo import DemoStopped  # noqa: PLC0415
    from lodestream.services.embedded import EmbeddedStack, StackPorts  # noqa: PLC0415

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    monitor = nats_port + 4000 if monitor_port is None else monitor_port
    ports = StackPorts(
        nats=nats_port, websocket=websocket_port, nats_http=monitor,
        postgres=postgres_port, api=api_port,
    )  # fmt: skip
    stack = EmbeddedStack(state_dir, ports)
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    supervisor = threading.Thread(target=_supervise, args=(stack, stop), daemon=True)
    try:
        with console.status("starting nats-server, Postgres, api, projector and controller…"):
            info = stack.start(user)
        # Supervised from here on: waiting for the monitoring credential (up to
        # CREDENTIAL_WAIT_S) must not leave a process that dies meanwhile unrepaired.
        supervisor.start()
        _print_info(info)
        _monitor_credential(stack, info)
        if demo:
            with console.status("starting the local site: agent and one pilot…"):
                _start_local_site(stack, info)
        if demo:
            try:
                _demo(info, demo_jobs, stop)
            except DemoStopped:
                console.print("demo interrupted")
                return
            if exit_after_demo:
                return
        console.print("[dim]stack running — Ctrl-C to stop[/dim]")
        stop.wait()
    except Exception as exc:
        err_console.print(f"[red]lode up failed:[/red] {exc}")
        raise typer.Exit(1) from exc
    finally:
        stop.set()
        if supervisor.is_alive():
            supervisor.join()
        with console.status("stopping…"):
            stack.stop()
        console.print("stopped; state kept in", str(state_dir))


def _print_info(info: StackInfo) -> None:
    from sqlalchemy.engine import make_url  # noqa: PLC0415

    table = Table(title="lodestream embedded stack", show_header=False)
    table.add_row("API", info.api_url)
    table.add_row("user / token", f"{info.user} / {info.token}")
    table.add_row("NATS (control plane)", f"{info.nats_url}  user {info.control_user}")
    table.add_row("NATS (sites, wss)", f"{info.websocket_url}  CA {info.ca_file}")
    postgres = make_url(info.database_url).render_as_string(hide_password=True)
    table.add_row("Postgres", f"{postgres}  passwords in {info.state_dir / 'secrets.json'}")
    table.add_row("state", str(info.state_dir))
    console.print(table)


CREDENTIAL_WAIT_S = 30.0


def _monitor_credential(stack: EmbeddedStack, info: StackInfo) -> None:
    """The local user's monitoring credential for `lode watch`, beside client.json.

    A convenience, never a reason for `lode up` to fail: the api answers 503 until its own
    NATS connection is up (a moment after it serves health), so a 503 is waited out for a
    while; if it persists the stack runs on and `lode watch` makes the credential later.
    """
    from lodestream.client.credential import ensure_credential  # noqa: PLC0415

    path = info.state_dir / "monitor.json"
    deadline = time.monotonic() + CREDENTIAL_WAIT_S
    with LodeClient(ClientConfig(info.api_url, info.token)) as client:
        while True:
            try:
                _, fresh = ensure_credential(client, path, info.websocket_url, info.ca_file)
                break
            except ApiError as exc:
                if exc.status != 503 or time.monotonic() > deadline:
                    err_console.print(f"[yellow]no monitoring credential yet:[/yellow] {exc}")
                    return
                time.sleep(0.5)
    if fresh:
        stack.supervise_once()  # apply it to nats-server now rather than at the next tick
    console.print(f"monitoring credential: {path}  (`lode watch` to see your sites live)")


def _supervise(stack: EmbeddedStack, stop: threading.Event) -> None:
    """The supervisor thread: restarts whatever dies, until Ctrl-C or SIGTERM."""
    while not stop.is_set():
        try:
            stack.supervise(stop)
        except Exception:
            # supervise() catches everything itself; this keeps the thread if that ever fails.
            log.exception("supervisor loop failed; starting it again")
            stop.wait(1.0)


def _start_local_site(stack: EmbeddedStack, info: StackInfo) -> None:
    """The demo's site: created once under the state dir, then its agent and one pilot."""
    from lodestream.agents.site.directory import init_site_dir  # noqa: PLC0415
    from lodestream.client.demo import DEMO_SITE  # noqa: PLC0415
    from lodestream.services.embedded.process import ServiceProcess  # noqa: PLC0415

    site_dir = info.state_dir / "sites" / DEMO_SITE
    if not (site_dir / "settings.yml").exists():
        public_key = init_site_dir(
            site_dir, DEMO_SITE, nats_url=info.websocket_url, ca_file=info.ca_file,
            api_url=info.api_url,
            launcher={"idle_ttl_s": 24 * 3600, "heartbeat_ttl_s": 10},
        )  # fmt: skip
        with LodeClient(ClientConfig(info.api_url, info.token)) as client:
            try:
                client.register_site(DEMO_SITE, "the local demo site", public_key=public_key)
            except ApiError as exc:
                if exc.status != 409:
                    raise
                client.register_site_key(DEMO_SITE, public_key)
    stack.supervise_once()  # apply the site's credential to nats-server before it connects
    cli = [sys.executable, "-m", "lodestream.client.cli.main"]
    for name, argv in (
        ("site-agent", [*cli, "site", "start", str(site_dir)]),
        ("launcher", [*cli, "launcher", "--site", str(site_dir), "--wall-time-min", "1440"]),
    ):
        service = ServiceProcess(name, argv, {}, info.state_dir / "logs" / f"{name}.log")
        service.start()
        stack.services.append(service)


def _demo(info: StackInfo, count: int, stop: threading.Event) -> None:
    from lodestream.client.demo import run_demo  # noqa: PLC0415

    def show(states: dict[str, int]) -> None:
        console.print("  " + ", ".join(f"{k} {v}" for k, v in sorted(states.items())))

    with LodeClient(ClientConfig(info.api_url, info.token)) as client:
        report = run_demo(client, count, progress=show, stop=stop)
    console.print(
        f"demo: {report.submitted} jobs submitted in {report.submit_seconds * 1000:.0f} ms, "
        f"all final after {report.seconds:.1f}s"
    )
    table = Table("state", "jobs", title=f"jobs tagged {report.batch_tag}")
    for state, n in sorted(report.states.items()):
        table.add_row(state, str(n))
    console.print(table)
    summary = Table(show_header=False, title="from the events")
    summary.add_row("throughput (first created → last finished)",
                    f"{report.throughput_jobs_s:,.1f} jobs/s")  # fmt: skip
    summary.add_row(
        "submit → RUNNING p50 / p95",
        f"{report.to_running_ms[0]:,.0f} / {report.to_running_ms[1]:,.0f} ms",
    )
    summary.add_row(
        "submit → JOB_FINISHED p50 / p95",
        f"{report.to_finished_ms[0]:,.0f} / {report.to_finished_ms[1]:,.0f} ms",
    )
    summary.add_row("DAG merge ran after both parents", "yes" if report.dag_order_ok else "NO")
    console.print(summary)
    console.print(f"try: lode job ls --tag {report.batch_tag}   ·   lode job show <id>")
