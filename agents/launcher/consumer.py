"""What the pilot's parts share about a delivery of ``launch-<site>``: the name the consumer
kernel logs it under, the delay before one handed back comes again, and how one that is no
work is dropped."""

from __future__ import annotations

import logging
from typing import Any, Final

from lodestream.agents.launcher.report import LauncherReport
from lodestream.eventlog.kernel import TERM, settle
from lodestream.schemas.topology import LAUNCH

log = logging.getLogger(__name__)

NAME: Final = "launcher"  # in the log lines of the consumer kernel
NAK_DELAY_S: Final = LAUNCH.retry_s  # the feed's settle policy for "not now"


async def skip(msg: Any, why: str, report: LauncherReport) -> None:
    """Not work (refused by the shared rule, or nothing to run): never redeliver it."""
    report.skipped += 1
    log.warning("launcher: skipped delivery on %s: %s", msg.subject, why)
    await settle(msg, TERM, NAME)
