"""``lode watch``: a live terminal view of your sites, read straight from the log.

Per site: the backlog by state, what runs, jobs done per second, and the latest failures
with their cause, folded from the events as they arrive (:mod:`lodestream.client.live`),
redrawn a few times per second. The events come over wss:// with your monitoring
credential (:mod:`lodestream.client.credential`), made and registered on first use.
"""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Final

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table

from lodestream import aio
from lodestream.client.cli.common import STATE_DIR_OPTION, console, print_error
from lodestream.client.cli.monitoring import (
    CA_FILE_OPTION,
    CREDENTIAL_OPTION,
    NATS_URL_OPTION,
    check_sites,
    monitor_access,
)
from lodestream.client.errors import CredentialRevoked, WatchError, WatchNotice

if TYPE_CHECKING:
    from lodestream.client.live import LiveView
    from lodestream.client.watch import Since, Watch, Watched

REFRESH_S: Final = 0.25
NEW_KEY_GRACE_S: Final = 15.0  # the control plane applies a new key within a few seconds


def watch_command(
    site: list[str] = typer.Option([], "--site", help="A site of yours (repeat); default: all."),
    since: str = typer.Option(
        "now", help="'now', a stream sequence (1: everything) or an ISO time with a zone."
    ),
    credential_file: Path | None = CREDENTIAL_OPTION,
    nats_url: str | None = NATS_URL_OPTION,
    ca_file: Path | None = CA_FILE_OPTION,
    new_credential: bool = typer.Option(False, help="Make and register a new credential."),
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """Watch your sites live: backlog, running, done per second, recent failures."""
    # Imported here, not at the top: the NATS client takes a sixth of a second to import,
    # and every `lode` start builds the whole command tree (tests/unit/test_cli_startup.py).
    from lodestream.client.watch import watch  # noqa: PLC0415

    start = _parse_since(since)
    access = monitor_access(state_dir, credential_file, nats_url, ca_file, renew=new_credential)
    credential, fresh = access.credential, access.fresh
    sites = check_sites(site, access.sites)

    def make() -> Watch:
        return watch(credential, sites, since=start, log_end=access.log_end)

    try:
        aio.run(_show(make, grace_s=NEW_KEY_GRACE_S if fresh else 0.0))
    except KeyboardInterrupt:
        return
    except WatchError as exc:
        print_error(exc)
        raise typer.Exit(1) from exc


async def _show(make: Callable[[], Watch], *, grace_s: float) -> None:
    from lodestream.client.live import LiveView, SiteLive  # noqa: PLC0415 - see watch_command

    deadline = time.monotonic() + grace_s
    while True:  # a key registered a moment ago may not be applied yet
        w = make()
        try:
            await w.__aenter__()
            break
        except CredentialRevoked:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1.0)
    view = LiveView({site: SiteLive(site) for site in w.sites})
    shown = 0.0
    with warnings.catch_warnings(), Live(console=console, auto_refresh=False) as live:
        warnings.simplefilter("ignore", WatchNotice)  # shown in the view instead
        live.update(render(view, w), refresh=True)
        async for item in _with_ticks(w):
            now = time.monotonic()
            if item is not None:
                view.apply(item, now)
            if now - shown >= REFRESH_S:
                live.update(render(view, w), refresh=True)
                shown = now


async def _with_ticks(w: Watch) -> AsyncIterator[Watched | None]:
    """The watch's events, and None every REFRESH_S when none comes (to redraw rates)."""
    iterator = aiter(w)
    pending = asyncio.ensure_future(anext(iterator))
    try:
        while True:
            done, _ = await asyncio.wait({pending}, timeout=REFRESH_S)
            if not done:
                yield None
                continue
            yield pending.result()
            pending = asyncio.ensure_future(anext(iterator))
    finally:
        pending.cancel()
        await w.close()


def render(view: LiveView, w: Watch) -> Group:
    now = time.monotonic()
    sites = Table(title="lodestream — live", expand=True)
    for column in ("site", "backlog by state", "running", "done/s", "events", "last seq"):
        sites.add_column(column, justify="left" if column.startswith(("site", "back")) else "right")
    for name in sorted(view.sites):
        s = view.sites[name]
        backlog = "  ".join(f"{state.value} {n}" for state, n in sorted(s.backlog().items()))
        sites.add_row(name, backlog or "—", str(s.running), f"{s.done_per_s(now):.1f}",
                      str(s.events), str(s.last_seq or "—"))  # fmt: skip
    failures = Table(title="recent failures", expand=True)
    for column in ("seq", "site", "job", "event", "cause"):
        failures.add_column(column)
    recent = sorted(
        ((f, name) for name, s in view.sites.items() for f in s.failures), key=lambda p: -p[0].seq
    )
    for f, name in recent[:10]:
        failures.add_row(str(f.seq), name, str(f.job)[:8], f.type, f.cause)
    parts: list[Table | str] = [sites, failures]
    if w.notices:
        parts.append(f"[yellow]{w.notices[-1]}[/yellow]")
    return Group(*parts)


def _parse_since(text: str) -> Since:
    if text == "now":
        return "now"
    if text.isdigit():
        return int(text)
    try:
        return datetime.fromisoformat(text)
    except ValueError as exc:
        raise typer.BadParameter(
            f"--since must be 'now', a sequence (e.g. 1) or an ISO time; got {text!r}"
        ) from exc
