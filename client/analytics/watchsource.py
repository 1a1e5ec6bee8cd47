"""Reading the user's own sites' events with their monitoring credential, as ``lode watch`` does.

The connection and the per-site consumers are the watch client's
(:func:`~lodestream.client.watch.connect_monitor`, :class:`~lodestream.client.watchfeed.SiteFeed`),
so the same nats-server permissions apply: a user reads their own sites and nothing else.
Sites are read one after the other (a job's and a pilot's events all live on its site's
subjects, so no fold needs two sites in step), each until its consumer holds nothing more,
or up to ``log_end`` (the log's last sequence when the analysis began).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Final

from lodestream.client.analytics.intake import Raw
from lodestream.client.analytics.selection import CLOCK_SLACK_S, Selection
from lodestream.client.credential import MonitorCredential
from lodestream.client.watch import connect_monitor, raise_if_refused
from lodestream.client.watchfeed import Restart, SiteFeed, Start

log = logging.getLogger(__name__)

WAIT_S: Final = 1.0


def start_of(selection: Selection) -> Start:
    """Where each site's consumer starts: the selection's sequence or time, else the start."""
    if selection.since_seq is not None:
        return Start(seq=selection.since_seq)
    if selection.since is not None:
        return Start(time=datetime.fromtimestamp(selection.since - CLOCK_SLACK_S, UTC))
    return Start(seq=1)


async def watch_batches(
    credential: MonitorCredential,
    sites: Sequence[str],
    selection: Selection,
    *,
    log_end: int | None = None,
) -> AsyncIterator[list[Raw]]:
    """The events of ``sites`` the selection starts at, site after site, in batches."""
    errors: list[Exception] = []
    nc = await connect_monitor(credential, errors)
    try:
        for site in sites:
            feed = SiteFeed(nc, credential.public_key, site, start_of(selection), errors=errors)
            try:
                await feed.open()
                async for raws in _drain(feed, errors, log_end):
                    yield raws
            finally:
                await feed.close()
    finally:
        with contextlib.suppress(Exception):
            await nc.close()


async def _drain(
    feed: SiteFeed, errors: list[Exception], log_end: int | None
) -> AsyncIterator[list[Raw]]:
    while feed.pending > 0:
        raise_if_refused(errors)
        try:
            got = await feed.next_batch(WAIT_S)
        except Restart as exc:
            # The feed starts again right after the last event it handed out.
            log.warning("site %s: %s; resuming after sequence %s", feed.site, exc.why,
                        feed.last_seq)  # fmt: skip
            await feed.restart()
            continue
        raws = [Raw(seq, msg.subject, msg.data) for seq, msg in got]
        if log_end is not None and raws and raws[-1].seq > log_end:
            yield [r for r in raws if r.seq <= log_end]
            return
        if raws:
            yield raws
