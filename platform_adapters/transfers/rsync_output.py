"""Reading what rsync says: its ``--stats`` on stdout, its errors and exit status.

Pure functions of captured text, tested against real rsync output in ``tests/data/transfers``.
Exit statuses map through an explicit table (rsync(1), EXIT VALUES); where a status covers
both kinds of failure (23, a partial transfer) rsync's own words decide.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from lodestream.platform_adapters.transfers.base import ItemOutcome


class Retry(enum.Enum):
    PERMANENT = "permanent"
    TRANSIENT = "transient"
    BY_WORDS = "by its words"  # permanent when stderr carries one of PERMANENT_WORDS


RSYNC_EXIT_CODES: Final[Mapping[int, tuple[str, Retry]]] = MappingProxyType({
    1: ("syntax or usage error", Retry.PERMANENT),
    2: ("protocol incompatibility", Retry.PERMANENT),
    3: ("errors selecting input/output files, dirs", Retry.BY_WORDS),
    4: ("requested action not supported", Retry.PERMANENT),
    5: ("error starting client-server protocol", Retry.TRANSIENT),
    6: ("daemon unable to append to log-file", Retry.TRANSIENT),
    10: ("error in socket I/O", Retry.TRANSIENT),
    11: ("error in file I/O", Retry.BY_WORDS),
    12: ("error in rsync protocol data stream", Retry.TRANSIENT),
    13: ("errors with program diagnostics", Retry.TRANSIENT),
    14: ("error in IPC code", Retry.TRANSIENT),
    19: ("received SIGUSR1", Retry.TRANSIENT),
    20: ("received SIGINT, SIGTERM, or SIGHUP", Retry.TRANSIENT),
    21: ("some error returned by waitpid()", Retry.TRANSIENT),
    22: ("error allocating core memory buffers", Retry.TRANSIENT),
    23: ("partial transfer due to error", Retry.BY_WORDS),
    24: ("partial transfer due to vanished source files", Retry.BY_WORDS),
    25: ("the --max-delete limit stopped deletions", Retry.PERMANENT),
    30: ("timeout in data send/receive", Retry.TRANSIENT),
    35: ("timeout waiting for daemon connection", Retry.TRANSIENT),
    # rsync's statuses for the remote shell and the command it runs there (no rsync on the
    # remote PATH is 127): the site's to mend, like the ssh failures below.
    124: ("the remote shell failed", Retry.TRANSIENT),
    125: ("the remote shell was killed", Retry.TRANSIENT),
    126: ("the remote command could not be run", Retry.TRANSIENT),
    127: ("the remote command was not found", Retry.TRANSIENT),
    # ssh's own status: no connection, a refused key, an unknown host key. All of them are
    # the site's to mend, and none is the item's fault, so the item is tried again.
    255: ("the ssh connection failed", Retry.TRANSIENT),
})  # fmt: skip

# What rsync (quoting strerror) says when no retry can help the item.
PERMANENT_WORDS: Final = (
    "No such file or directory",
    "Permission denied",
    "Operation not permitted",
    "No space left on device",
    "Disk quota exceeded",
    "Read-only file system",
    "Not a directory",
    "Is a directory",
    "File name too long",
)
_UNLISTED: Final = "an exit status rsync does not list"
_REASON_MAX: Final = 1000
_TRANSFERRED = re.compile(r"^Total transferred file size: ([\d,.']+) bytes", re.MULTILINE)
_SKIPPED_DIR = re.compile(r"^skipping directory (.+)$", re.MULTILINE)


def transferred_bytes(stdout: str) -> int | None:
    """``Total transferred file size`` from ``--stats``: the bytes of the files rsync wrote.

    Digit-group separators (``1,048,576``, printed unless ``--no-human-readable``) are
    dropped. None when the stats are missing (rsync stopped before printing them).
    """
    match = _TRANSFERRED.search(stdout)
    if match is None:
        return None
    return int(re.sub(r"[,.']", "", match.group(1)))


def skipped_directories(stdout: str) -> list[str]:
    """Directories rsync skipped because the transfer was not recursive (it exits 0)."""
    return [name.strip() for name in _SKIPPED_DIR.findall(stdout)]


_KEPT = re.compile(r"^(.+) exists \((?!uptodate\))[a-z ]+\)$", re.MULTILINE)


def kept_conflicts(stdout: str) -> list[str]:
    """Files ``--ignore-existing --info=skip2`` kept although they differ from the source.

    rsync says ``NAME exists (uptodate)`` for a file that matches (size and mtime, or its
    checksum with ``--checksum``) and ``NAME exists (file change)`` or ``(sum change)`` for
    one that does not.
    """
    return [name.strip() for name in _KEPT.findall(stdout)]


def error_words(stderr: str) -> str:
    """rsync's (and ssh's) complaints on stderr, one line each, joined; bounded in length."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    said = "; ".join(lines)
    return said if len(said) <= _REASON_MAX else said[: _REASON_MAX - 3] + "..."


def item_outcome(returncode: int, stdout: str, stderr: str) -> ItemOutcome:
    """The outcome of one item's rsync run, from its exit status and output."""
    if returncode < 0:
        return ItemOutcome(ok=False, reason=f"rsync was killed by signal {-returncode}")
    if returncode == 0:
        if skipped := skipped_directories(stdout):
            return ItemOutcome(
                ok=False,
                reason=f"rsync: skipping directory {skipped[0]}: the item is not recursive",
                permanent=True,
            )
        return ItemOutcome(ok=True, bytes_transferred=transferred_bytes(stdout))
    meaning, retry = RSYNC_EXIT_CODES.get(returncode, (_UNLISTED, Retry.TRANSIENT))
    said = error_words(stderr) or f"rsync exited {returncode} ({meaning})"
    if retry is Retry.BY_WORDS:
        permanent = any(words in stderr for words in PERMANENT_WORDS)
    else:
        permanent = retry is Retry.PERMANENT
    return ItemOutcome(ok=False, reason=said, permanent=permanent)
