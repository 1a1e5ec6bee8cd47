"""``lode watch``: a live terminal view of your sites, read straight from the log.

Per site: the backlog by state, what runs, jobs done per second, the totals finished and
failed, and the latest failures with their cause, folded from the events as they arrive
(:mod:`lodestream.client.live`), redrawn a few times per second. The events come over
wss:// with your monitoring credential (:mod:`lodestream.client.credential`), made and
registered on first use.

From ``now`` (the default) the view starts from the API's snapshot of your jobs
(``GET /ui/api/summary``) and watches from the sequence after its position, so its counts
are the read model's from the start. ``--app`` and ``--tag`` choose the jobs shown. The
watch's notices (a reconnect, a resume) and any library warning go to a log file, not
onto the screen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table

from lodestream import aio
from lodestream.client.cli.common import STATE_DIR_OPTION, api_client, console, print_error
from lodestream.client.cli.filters import APP_OPTION, parse_tags, tag_dict
from lodestream.client.cli.monitoring import (
    CA_FILE_OPTION,
    CREDENTIAL_OPTION,
    NATS_URL_OPTION,
    check_sites,
    monitor_access,
)
from lodestream.client.errors import CredentialRevoked, LodeClientError, WatchError, WatchNotice
from lodestream.schemas.ids import short_id

if TYPE_CHECKING:
    from lodestream.client.live import LiveView, Selection
    from lodestream.client.watch import Since, Watch, Watched

REFRESH_S: Final = 0.25
NEW_KEY_GRACE_S: Final = 15.0  # the control plane applies a new key within a few seconds
LOG_FILE: Final = "watch.log"  # in the state directory, unless --log-file says otherwise


def watch_command(
    site: list[str] = typer.Option([], "--site", help="A site of yours (repeat); default: all."),
    since: str = typer.Option(
        "now", help="'now', a stream sequence (1: everything) or an ISO time with a zone."
    ),
    app: str | None = APP_OPTION,
    tag: list[str] = typer.Option(
        [], "--tag", "-t", help="Only jobs with tag key:value (repeatable; all must match)."
    ),
    credential_file: Path | None = CREDENTIAL_OPTION,
    nats_url: str | None = NATS_URL_OPTION,
    ca_file: Path | None = CA_FILE_OPTION,
    new_credential: bool = typer.Option(False, help="Make and register a new credential."),
    log_file: Path | None = typer.Option(
        None, help=f"Where notices and warnings go (default: <state-dir>/{LOG_FILE})."
    ),
    state_dir: Path = STATE_DIR_OPTION,
) -> None:
    """Watch your sites live: backlog, running, done per second, totals, recent failures."""
    # Imported here, not at the top: the NATS client takes a sixth of a second to import,
    # and every `lode` start builds the whole command tree (tests/unit/test_cli_startup.py).
    from lodestream.client.live import LiveView, Selection  # noqa: PLC0415
    from lodestream.client.watch import watch  # noqa: PLC0415

    start = _parse_since(since)
    tags = parse_tags(tag)
    selection = Selection(app, tag_dict(tag))
    access = monitor_access(state_dir, credential_file, nats_url, ca_file, renew=new_credential)
    credential, fresh = access.credential, access.fresh
    sites = check_sites(site, access.sites)
    view = LiveView.of(sites, selection)
    log_end = access.log_end
    if start == "now":  # from the read model's snapshot, then every event after it
        position = view.seed(_summary(state_dir, app, tags))
        start, log_end = position + 1, max(log_end, position)

    def make() -> Watch:
        return watch(credential, sites, since=start, log_end=log_end)

    log_path = log_file or state_dir / LOG_FILE
    try:
        with _logging_to(log_path):
            aio.run(_show(make, view, log_path, grace_s=NEW_KEY_GRACE_S if fresh else 0.0))
    except KeyboardInterrupt:
        return
    except WatchError as exc:
        print_error(exc)
        raise typer.Exit(1) from exc


def _summary(state_dir: Path, app: str | None, tags: list[str]) -> dict[str, Any]:
    with api_client(state_dir) as client:
        try:
            return client.summary(app, tags)
        except LodeClientError as exc:
            print_error(exc)
            raise typer.Exit(1) from exc


@contextlib.contextmanager
def _logging_to(path: Path) -> Iterator[None]:
    """Send every log record and warning to ``path`` while the view owns the terminal."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    with warnings.catch_warnings():
        warnings.simplefilter("always", WatchNotice)  # each notice is a line in the log
        logging.captureWarnings(True)
        try:
            yield
        finally:
            logging.captureWarnings(False)
            root.handlers[:], root.level = saved[0], saved[1]
            handler.close()


async def _show(
    make: Callable[[], Watch], view: LiveView, log_path: Path, *, grace_s: float
) -> None:
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
    shown = 0.0
    with Live(console=console, auto_refresh=False) as live:
        live.update(render(view, w, log_path), refresh=True)
        async for item in _with_ticks(w):
            now = time.monotonic()
            if item is not None:
                view.apply(item, now)
            if now - shown >= REFRESH_S:
                live.update(render(view, w, log_path), refresh=True)
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


def render(view: LiveView, w: Watch, log_path: Path) -> Group:
    now = time.monotonic()
    title = "lodestream — live" + _selection_title(view.selection)
    sites = Table(title=title, expand=True)
    columns = ("site", "backlog by state", "running", "done/s", "finished", "failed", "events",
               "last seq")  # fmt: skip
    for column in columns:
        sites.add_column(column, justify="left" if column.startswith(("site", "back")) else "right")
    for name in sorted(view.sites):
        s = view.sites[name]
        backlog = "  ".join(f"{state.value} {n}" for state, n in sorted(s.backlog().items()))
        sites.add_row(name, backlog or "—", str(s.running), f"{s.done_per_s(now):.1f}",
                      str(s.finished), str(s.failed), str(s.events),
                      str(s.last_seq or "—"))  # fmt: skip
    failures = Table(title="recent failures", expand=True)
    for column in ("seq", "site", "job", "what", "cause"):
        failures.add_column(column)
    recent = sorted(
        ((f, name) for name, s in view.sites.items() for f in s.failures), key=lambda p: -p[0].seq
    )
    for f, name in recent[:10]:
        failures.add_row(str(f.seq), name, short_id(f.job), f.type, f.cause)
    parts: list[Table | str] = [sites, failures]
    if w.notices:
        parts.append(f"[dim]{len(w.notices)} notices in {log_path}[/dim]")
    return Group(*parts)


def _selection_title(selection: Selection) -> str:
    chosen = [f"app {selection.app}"] if selection.app else []
    chosen += [f"{key}:{value}" for key, value in selection.tags.items()]
    return f" ({', '.join(chosen)})" if chosen else ""


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
