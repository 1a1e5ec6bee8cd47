"""The ``lode`` command."""

from __future__ import annotations

import typer

from lodestream.client.cli import (
    analytics,
    apps,
    events,
    job_actions,
    job_results,
    jobs,
    login,
    queue,
    services,
    site,
    stack,
    tokens,
    transfers,
    watch,
    whoami,
)

app = typer.Typer(
    name="lode",
    help="lodestream: send analysis jobs to your HPC sites and watch them run.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.command("up")(stack.up)
app.command("login")(login.login)
app.command("whoami")(whoami.whoami)
app.command("doctor")(whoami.doctor)
app.command("api")(services.api)
app.command("migrate")(services.migrate)
app.command("controller")(services.controller)
app.add_typer(services.projector_app, name="projector")
app.add_typer(services.user_app, name="user")
app.add_typer(tokens.token_app, name="token")
site.site_app.command("transfers")(transfers.site_transfers)  # beside the other transfer views
app.add_typer(site.site_app, name="site")
app.command("launcher")(site.launcher)
jobs.job_app.command("kill")(job_actions.job_kill)
jobs.job_app.command("reset")(job_actions.job_reset)
jobs.job_app.command("wait")(job_results.job_wait)
jobs.job_app.command("result")(job_results.job_result)
app.add_typer(jobs.job_app, name="job")
app.add_typer(apps.app_app, name="app")
app.command("events")(events.events)
app.add_typer(queue.queue_app, name="queue")
app.command("watch")(watch.watch_command)
app.add_typer(analytics.analytics_app, name="analytics")

if __name__ == "__main__":
    app()
