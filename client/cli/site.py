"""``lode site init|start|stop|rm|ls|globus-login`` and ``lode launcher``."""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Final

import typer
from rich.table import Table

from lodestream import aio
from lodestream.client.cli.common import (
    STATE_DIR_OPTION,
    api_client,
    console,
    err_console,
    print_error,
)
from lodestream.client.cli.whoami import sync_line

site_app = typer.Typer(help="Sites you own: create, run, remove.")
# `lode site start --daemon` hands its child this file to write once connected.
READY_FILE_ENV: Final = "LODE_SITE_READY_FILE"
DAEMON_WAIT_S: Final = 30.0
DAEMON_POLL_S: Final = 0.1


def _stack_defaults(state_dir: Path) -> dict[str, str]:
    path = state_dir / "sites.json"
    return json.loads(path.read_text()) if path.exists() else {}


@site_app.command("init")
def site_init(
    directory: Path = typer.Argument(..., help="Site directory to create."),
    name: str = typer.Option(..., "--name", help="Site name: a lowercase slug, unique."),
    description: str = typer.Option("", help="Free text shown in `lode site ls`."),
    nats_url: str | None = typer.Option(None, help="wss:// URL of NATS (default: lode up's)."),
    ca_file: Path | None = typer.Option(None, help="CA of the NATS TLS listener."),
    examples: bool = typer.Option(True, help="Copy the example apps into apps/."),
    rebind: bool = typer.Option(
        False, "--rebind", help="The site exists: give it this new key (its agents are cut off)."
    ),
    yes: bool = typer.Option(False, "--yes", "-y", help="With --rebind: do not ask."),
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """Create a site directory, generate its nkey (the seed stays here), register it.

    A site that is already registered keeps its key unless ``--rebind`` is given: the new key
    replaces it, and every agent and pilot still using the old one is cut off."""
    from lodestream.agents.site.directory import init_site_dir  # noqa: PLC0415
    from lodestream.schemas.errors import SubjectError  # noqa: PLC0415

    defaults = _stack_defaults(state_dir)
    nats_url = nats_url or defaults.get("websocket_url")
    ca = ca_file or (Path(defaults["ca_file"]) if "ca_file" in defaults else None)
    if not nats_url:
        raise typer.BadParameter("no NATS URL: pass --nats-url or start a stack with `lode up`")
    with api_client(state_dir) as client:
        exists = any(s["name"] == name for s in client.list_sites())
    if exists and not rebind:
        raise typer.BadParameter(
            f"site {name!r} is already registered, with the key its agent and pilots use; "
            "choose another name, or pass --rebind to give it a new key (cutting off every "
            "process that holds the old one)",
            param_hint="--name",
        )
    if exists and not yes:
        typer.confirm(
            f"give site {name!r} a new key? its running agent and pilots are cut off", abort=True
        )
    try:
        public_key = init_site_dir(
            directory, name, nats_url=nats_url, ca_file=ca, examples=examples,
            api_url=defaults.get("api_url", "http://127.0.0.1:8400"),
        )  # fmt: skip
    except (SubjectError, FileExistsError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    with api_client(state_dir) as client:
        if exists:
            client.register_site_key(name, public_key)
        else:
            client.register_site(name, description, public_key=public_key)
    console.print(f"site [bold]{name}[/bold] created in {directory}; key {public_key[:12]}…")
    console.print(f"next: lode site start {directory}  and  lode launcher --site {directory}")


@site_app.command("start")
def site_start(
    directory: Path = typer.Argument(..., help="Site directory."),
    daemon: bool = typer.Option(False, help="Run in the background; PID in log/agent.pid."),
    wait_s: float = typer.Option(
        DAEMON_WAIT_S, help="With --daemon: how long to wait for the agent to connect."
    ),
) -> None:
    """Run the site agent (apps, hooks, cleaner); stops cleanly on SIGTERM.

    With ``--daemon`` it returns once the agent has loaded its settings and apps and NATS has
    accepted its key; an agent that exits first is reported with the end of its log (exit
    status 1), and one not connected after ``--wait-s`` is left running (exit status 3)."""
    from lodestream.agents.site.apps import AppError  # noqa: PLC0415
    from lodestream.agents.site.credential import (  # noqa: PLC0415
        EXIT_CREDENTIAL_REVOKED,
        CredentialRevoked,
    )
    from lodestream.agents.site.main import run  # noqa: PLC0415
    from lodestream.agents.site.settings import SiteSettingsError, load_site_settings  # noqa: PLC0415

    try:
        settings = load_site_settings(directory)
    except SiteSettingsError as exc:
        print_error(exc)
        raise typer.Exit(2) from exc
    if daemon:
        _start_daemon(directory, settings.log_dir, wait_s)
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    ready = os.environ.get(READY_FILE_ENV)
    try:
        aio.run_service(run(directory, on_connected=_mark(Path(ready)) if ready else None))
    except (AppError, SiteSettingsError) as exc:
        print_error(exc)
        raise typer.Exit(2) from exc
    except CredentialRevoked as exc:
        print_error(exc)
        raise typer.Exit(EXIT_CREDENTIAL_REVOKED) from exc


def _mark(path: Path) -> Callable[[], None]:
    def mark() -> None:
        path.write_text(f"{os.getpid()}\n")

    return mark


def _start_daemon(directory: Path, log_dir: Path, wait_s: float) -> None:
    """Start the agent in the background and wait until it is connected, or has exited."""
    ready = log_dir / "agent.ready"
    ready.unlink(missing_ok=True)
    log_path = log_dir / "agent.log"
    start = log_path.stat().st_size if log_path.exists() else 0
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lodestream.client.cli.main", "site", "start", str(directory)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env={**os.environ, READY_FILE_ENV: str(ready)},
        )  # fmt: skip
    (log_dir / "agent.pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + wait_s
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(DAEMON_POLL_S)
    if ready.exists():
        console.print(f"site agent started (pid {proc.pid}); log in {log_path}")
        return
    if proc.poll() is not None:
        (log_dir / "agent.pid").unlink(missing_ok=True)
        with log_path.open("rb") as f:
            f.seek(start)
            tail = f.read().decode(errors="replace").strip().splitlines()[-15:]
        err_console.print(f"error: the site agent exited at once (status {proc.returncode}):")
        err_console.print("\n".join(tail) or "(nothing in its log)", markup=False)
        raise typer.Exit(1)
    err_console.print(
        f"warning: the site agent (pid {proc.pid}) is running but not connected to NATS after "
        f"{wait_s:g} s; it keeps trying. See {log_path}"
    )
    raise typer.Exit(3)


@site_app.command("stop")
def site_stop(directory: Path = typer.Argument(..., help="Site directory.")) -> None:
    """Stop a site agent started with --daemon."""
    pid_file = directory / "log" / "agent.pid"
    if not pid_file.exists():
        raise typer.BadParameter(f"no {pid_file}: is the agent running as a daemon?")
    pid = int(pid_file.read_text())
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        console.print(f"agent {pid} was not running")
    pid_file.unlink()


@site_app.command("register")
def site_register(name: str, description: str = "", state_dir: Path = STATE_DIR_OPTION) -> None:
    """Register a site name (a lowercase slug) under your user."""
    with api_client(state_dir) as client:
        result = client.register_site(name, description)
    console.print(f"site [bold]{result['name']}[/bold] registered (seq {result['seq']})")


@site_app.command("ls")
def site_ls(
    as_json: bool = typer.Option(False, "--json", help="Print the API's JSON array."),
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """List your sites."""
    with api_client(state_dir) as client:
        sites = client.list_sites()
        sync = client.health().get("credentials")
    if as_json:
        typer.echo(json.dumps(sites))
        return
    table = Table("name", "description", "transfer locations", "created", "credential")
    for site in sites:
        locations = ", ".join(sorted(site.get("transfer_locations") or {}))
        error = site.get("credential_error")
        credential = f"FAILED: {error}" if error else ("applied" if site.get("public_key") else "-")
        table.add_row(site["name"], site.get("description", ""), locations,
                      str(site.get("created_at", "")), credential)  # fmt: skip
    console.print(table)
    if sync is not None and sync["state"] != "ok":
        err_console.print(sync_line(sync), highlight=False, markup=False)


@site_app.command("rm")
def site_rm(name: str, state_dir: Path = STATE_DIR_OPTION) -> None:
    """Remove a site you own; its credential is revoked within seconds."""
    with api_client(state_dir) as client:
        client.remove_site(name)
    console.print(f"site {name} removed")


@site_app.command("globus-login")
def site_globus_login(
    directory: Path = typer.Argument(..., help="Site directory; the tokens are kept in it."),
    client_id: str | None = typer.Option(
        None,
        "--client-id",
        envvar="LODE_GLOBUS_CLIENT_ID",
        help="Client id of your Globus native app (register one at app.globus.org).",
    ),
    collections: list[str] = typer.Option(
        [],
        "--collection",
        help="A GCS v5 mapped collection this site stages through (data_access consent); "
        "repeat for each.",
    ),
) -> None:
    """Log this site in to Globus; its refresh token goes to <site>/globus-tokens.json (0600)."""
    from globus_sdk import GlobusAPIError, NetworkError  # noqa: PLC0415

    from lodestream.agents.site.settings import SETTINGS_FILE  # noqa: PLC0415
    from lodestream.platform_adapters.transfers.base import ConsentRequired  # noqa: PLC0415
    from lodestream.platform_adapters.transfers.globus_errors import globus_words  # noqa: PLC0415
    from lodestream.platform_adapters.transfers.globus_login import (  # noqa: PLC0415
        PLACEHOLDER_CLIENT_ID,
        check_client_id,
        check_collection_ids,
        login,
        token_path,
    )

    # Errors go through print_error, not BadParameter's box: they carry paths and a URL that
    # must stay copyable.
    if not (directory / SETTINGS_FILE).is_file():
        print_error(f"{directory} is not a site directory (no {SETTINGS_FILE})")
        raise typer.Exit(2)
    try:
        client_id = check_client_id(client_id or PLACEHOLDER_CLIENT_ID)
        collections = check_collection_ids(collections)
    except ValueError as exc:
        print_error(exc)
        raise typer.Exit(2) from exc

    def ask_code(url: str) -> str:
        console.print("Open this URL, log in to Globus and consent:", highlight=False)
        console.out(url, highlight=False)  # printed bare, so it stays one copyable line
        return str(typer.prompt("Paste the authorization code here"))

    try:
        login(directory, client_id=client_id, collections=collections, ask_code=ask_code)
    except (GlobusAPIError, NetworkError, ConsentRequired, ValueError) as exc:
        words = globus_words(exc) if isinstance(exc, GlobusAPIError) else str(exc)
        print_error(f"Globus login failed: {words}")
        raise typer.Exit(1) from exc
    console.print(f"Globus tokens stored in {token_path(directory)}", soft_wrap=True)


def launcher(
    site: Path = typer.Option(..., "--site", help="Site directory."),
    wall_time_min: float = typer.Option(60.0, min=0.1, help="Wall time of this pilot."),
    mode: str | None = typer.Option(
        None,
        help="serial (single-rank jobs) or mpi (any job, through the MPI app launcher); "
        "default: the site's launcher.mode.",
    ),
    batch_job_id: str | None = typer.Option(
        None, "--batch-job-id", help="The batch job this pilot runs in (set by its job script)."
    ),
    tag: list[str] = typer.Option(
        [],
        "--tag",
        help="key:value: run only jobs with this tag (repeatable: all of them); others are "
        "left to other pilots.",
    ),
) -> None:
    """Run a pilot: open a session, lease and run this site's jobs, exit when idle."""
    from lodestream.agents.launcher.errors import PilotRefused, TagFilterError  # noqa: PLC0415
    from lodestream.agents.launcher.main import run  # noqa: PLC0415
    from lodestream.agents.launcher.plan import plan_pilot  # noqa: PLC0415
    from lodestream.agents.launcher.tags import parse_tag_filter  # noqa: PLC0415
    from lodestream.agents.launcher.workers import run_workers  # noqa: PLC0415
    from lodestream.agents.site.apps import AppError, load_apps  # noqa: PLC0415
    from lodestream.agents.site.credential import (  # noqa: PLC0415
        EXIT_CREDENTIAL_REVOKED,
        CredentialRevoked,
    )
    from lodestream.agents.site.settings import (  # noqa: PLC0415
        JobMode,
        SiteSettingsError,
        load_site_settings,
    )

    modes: dict[str | None, JobMode | None] = {None: None, "serial": "serial", "mpi": "mpi"}
    if mode not in modes:
        raise typer.BadParameter("mode must be serial or mpi")
    try:
        batch = uuid.UUID(batch_job_id) if batch_job_id is not None else None
    except ValueError as exc:
        raise typer.BadParameter(f"--batch-job-id {batch_job_id!r} is not a UUID") from exc
    try:
        filter_tags = parse_tag_filter(tag)
    except TagFilterError as exc:
        raise typer.BadParameter(str(exc)) from exc
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        # Everything this machine must provide is checked here, before connecting.
        settings = load_site_settings(site)
        load_apps(settings.apps_dir)
        plan = plan_pilot(settings, mode=modes[mode])
        if plan.mpi4py_workers:  # one rank per node; rank 0 is the pilot and reports itself
            echo = functools.partial(err_console.out, highlight=False)
            code = run_workers(plan, site, wall_time_min=wall_time_min, batch_job_id=batch,
                               filter_tags=filter_tags, echo=echo)  # fmt: skip
            raise typer.Exit(code)
        report = aio.run_service(run(site, wall_time_min=wall_time_min, plan=plan,
                                     batch_job_id=batch, filter_tags=filter_tags))  # fmt: skip
    except (AppError, SiteSettingsError, PilotRefused) as exc:
        print_error(exc)
        raise typer.Exit(2) from exc
    except CredentialRevoked as exc:  # its tasks are killed: nothing could be reported
        print_error(exc)
        raise typer.Exit(EXIT_CREDENTIAL_REVOKED) from exc
    console.print(
        f"launcher done ({report.exit_reason}): {report.finished} finished, "
        f"{report.errored} errored, {report.timed_out} timed out, {report.fenced} fenced"
    )
