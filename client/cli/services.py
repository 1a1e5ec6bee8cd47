"""``lode api``, ``lode projector run|rebuild``, ``lode migrate``, ``lode user create|ls``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from lodestream import aio
from lodestream.client.cli.common import STATE_DIR_OPTION, console, print_error
from lodestream.settings import Settings

if TYPE_CHECKING:
    from lodestream.services.embedded.state import StackRole

projector_app = typer.Typer(help="The projector: folds the log into the Postgres read models.")
user_app = typer.Typer(help="API users and tokens.")


def _settings(state_dir: Path, role: StackRole) -> Settings:
    """Settings from the environment, defaulted from the embedded stack as ``role``.

    ``role`` picks the stack's Postgres login: each command gets the least it needs.
    """
    from lodestream.services.embedded.state import apply_stack_environment  # noqa: PLC0415

    apply_stack_environment(state_dir, role)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return Settings()


def api(state_dir: Path = STATE_DIR_OPTION) -> None:
    """Serve the HTTP API (settings from LODE_* / NATS_URL / DATABASE_URL)."""
    _settings(state_dir, "api")
    from lodestream.services.api.__main__ import main  # noqa: PLC0415 - import FastAPI only when serving

    main()


def migrate(state_dir: Path = STATE_DIR_OPTION) -> None:
    """Apply the Postgres migrations to DATABASE_URL."""
    from lodestream.infra.postgres.migrate import upgrade  # noqa: PLC0415
    from lodestream.services.embedded.stack import grant_stack_roles  # noqa: PLC0415

    settings = _settings(state_dir, "admin")
    upgrade(settings.database_url)
    console.print("migrations applied")
    if grant_stack_roles(state_dir, settings.database_url):
        console.print("service roles granted")


def controller(state_dir: Path = STATE_DIR_OPTION) -> None:
    """Run the controller (DAG release, lease expiry and fencing) until SIGINT/SIGTERM."""
    from lodestream.services.controller.main import run  # noqa: PLC0415

    aio.run_service(run(_settings(state_dir, "controller")))


@projector_app.command("run")
def projector_run(state_dir: Path = STATE_DIR_OPTION) -> None:
    """Run the live projector until SIGINT/SIGTERM."""
    from lodestream.services.projector.main import run  # noqa: PLC0415

    aio.run_service(run(_settings(state_dir, "projector")))


@projector_app.command("rebuild")
def projector_rebuild(
    state_dir: Path = STATE_DIR_OPTION,
    workers: int | None = typer.Option(
        None,
        "--workers",
        min=1,
        max=64,
        help="Processes that fold the log's jobs (default: one per core, up to 4, for a log "
        "of 250,000 events or more on two cores or more; else 1: this process alone).",
    ),
) -> None:
    """Replay the log from sequence 1 into fresh tables and swap them in atomically."""
    from lodestream.services.projector.main import rebuild  # noqa: PLC0415

    # The projector's role owns the read models: it may create, swap and drop them.
    report = aio.run(rebuild(_settings(state_dir, "projector"), workers=workers))
    folded_by = "" if report.workers == 1 else f", folded by {report.workers} processes"
    console.print(
        f"rebuilt {report.events:,} events ({report.jobs:,} jobs, {report.quarantined} "
        f"quarantined{folded_by}) in {report.seconds:.1f}s — "
        f"{report.events_per_second:,.0f} events/s"
    )


@user_app.command("create")
def user_create(
    name: str = typer.Argument(..., help="User name (letters, digits, . _ -)."),
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """Create a user (or a new token for an existing one) and print the API token once."""
    from lodestream.services.api.users import create_user  # noqa: PLC0415

    settings = _settings(state_dir, "api")
    try:
        token = create_user(settings.database_url, name)
    except ValueError as exc:
        print_error(exc)
        raise typer.Exit(2) from exc
    console.print(token)


@user_app.command("ls")
def user_ls(state_dir: Path = STATE_DIR_OPTION) -> None:
    """Every API user, with when it was made and how many live tokens it has (for the
    stack's admin: reads the stack's database, as `lode user create` does)."""
    from lodestream.services.api.users import list_users  # noqa: PLC0415

    settings = _settings(state_dir, "api")
    table = Table("user", "created", "live tokens")
    for name, created, tokens in list_users(settings.database_url):
        table.add_row(name, str(created), str(tokens))
    console.print(table)
