"""What a pilot did, returned by ``Launcher.run`` and logged when it exits."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Tally(StrEnum):
    """The counter a reported run result adds to; each value names a field of the report."""

    FINISHED = "finished"
    ERRORED = "errored"
    TIMED_OUT = "timed_out"


class ExitReason(StrEnum):
    """Why a pilot stopped leasing: in its report, its session's close and its log line, and
    what its batch job's verdict is read from (``decide.batch_verdict``)."""

    STOPPED = "stopped"  # told to (SIGTERM: the user, the site agent or the scheduler)
    WALL_TIME = "wall time reached"  # its own wall time ran out
    IDLE = "idle"  # nothing to run for idle_ttl_s
    SESSION_LOST = "session lost"  # the controller expired its session
    SESSION_REFUSED = "session refused"  # the session could not be opened
    REVOKED = "credential revoked"  # the site's credential no longer works
    NOT_STARTED = ""  # not decided yet


@dataclass(slots=True)
class LauncherReport:
    started: int = 0
    finished: int = 0
    errored: int = 0
    lost_races: int = 0
    fenced: int = 0
    timed_out: int = 0
    killed: int = 0
    skipped: int = 0  # deliveries the shared rule refused, or that carried no work
    not_runnable: int = 0  # job.created of jobs the controller moves on (acked, not work)
    duplicates: int = 0  # deliveries of a job this pilot already held
    deferred: int = 0  # retries handed back to the server until they fall due
    refused: int = 0  # jobs this pilot can never run (left to another pilot, or failed)
    cache_deferred: int = 0  # deliveries handed back for a peer whose caches hold the inputs
    cache_hits: int = 0  # inputs its node caches held already
    cache_misses: int = 0  # inputs copied into them
    cache_bytes_copied: int = 0
    filtered: int = 0  # deliveries outside this pilot's tag filter, handed back unleased
    returned: int = 0  # deliveries kept for a slot (prefetch), handed back unleased
    kept: int = 0  # results the hub did not answer for, kept at the site's leaf node
    exit_reason: ExitReason = ExitReason.NOT_STARTED

    def count(self, tally: Tally) -> None:
        """One more result of the kind ``tally`` landed on the log."""
        setattr(self, tally.value, getattr(self, tally.value) + 1)
