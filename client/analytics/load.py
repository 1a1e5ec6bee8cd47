"""Loading a selection of the log from where it is: a copy in a file, or a live stream.

::

    loaded = load_file(Path("events.jsonl"), Selection.of(sites=["alpha"]))
    loaded = await load_stream(nc, selection)          # a control-plane connection
    loaded = await load_watch(credential, ["alpha"], selection, log_end=...)
    summary = summarize(loaded)

Each reads in batches and hands them to one :class:`~lodestream.client.analytics.replay.Replay`
(with the cyclic collector paused: :mod:`~lodestream.collector`);
:func:`export_stream` and :func:`export_watch` write the same messages to a copy instead.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from nats.aio.client import Client

from lodestream.client.analytics.errors import OutputError
from lodestream.client.analytics.intake import Raw
from lodestream.client.analytics.jsonl import export_line, file_batches
from lodestream.client.analytics.pick import JobPick
from lodestream.client.analytics.replay import Replay
from lodestream.client.analytics.selection import Selection
from lodestream.client.analytics.stream import stream_batches
from lodestream.client.analytics.summary import Loaded
from lodestream.client.analytics.watchsource import watch_batches
from lodestream.client.credential import MonitorCredential
from lodestream.collector import collector_paused


def load_file(path: Path, selection: Selection | None = None) -> Loaded:
    """The selection of the copy of the log at ``path`` (``lode analytics export``)."""
    replay = Replay(selection)
    with collector_paused():
        for raws in file_batches(path, replay.report):
            replay.take(raws)
    return replay.loaded()


async def load_stream(nc: Client, selection: Selection | None = None) -> Loaded:
    """The selection of ``EVENTS``, read over a control-plane connection ``nc``."""
    replay = Replay(selection)
    with collector_paused():
        async for raws in stream_batches(nc, replay.selection):
            replay.take(raws)
    return replay.loaded()


async def load_watch(
    credential: MonitorCredential,
    sites: Sequence[str],
    selection: Selection | None = None,
    *,
    log_end: int | None = None,
) -> Loaded:
    """The selection of ``sites``' events, read with the user's monitoring credential."""
    replay = Replay(selection)
    with collector_paused():
        async for raws in watch_batches(credential, sites, replay.selection, log_end=log_end):
            replay.take(raws)
    return replay.loaded()


async def export_stream(nc: Client, selection: Selection, out: Path) -> int:
    """Copy the selected messages of ``EVENTS`` to ``out``; how many were written."""
    return await _export(stream_batches(nc, selection), out, selection)


async def export_watch(
    credential: MonitorCredential,
    sites: Sequence[str],
    selection: Selection,
    out: Path,
    *,
    log_end: int | None = None,
) -> int:
    """Copy ``sites``' messages, read with the monitoring credential, to ``out``."""
    batches = watch_batches(credential, sites, selection, log_end=log_end)
    return await _export(batches, out, selection)


async def _export(batches: AsyncIterator[list[Raw]], out: Path, selection: Selection) -> int:
    """Write ``batches`` to ``out``: only the selected jobs' events when the selection picks
    jobs (:class:`JobPick`), every message otherwise."""
    pick = JobPick(selection) if JobPick.needed(selection) else None
    written = 0
    partial = out.with_name(f".{out.name}.partial")
    try:
        with partial.open("wb") as handle:
            async for raws in batches:
                kept = raws if pick is None else [raw for raw in raws if pick.keeps(raw)]
                handle.writelines(export_line(raw) for raw in kept)
                written += len(kept)
        partial.replace(out)  # a copy cut short never passes for a whole one
    except OSError as exc:
        raise OutputError(f"cannot write {out}: {exc.strerror or exc}") from exc
    finally:
        partial.unlink(missing_ok=True)
    return written
