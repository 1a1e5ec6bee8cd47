"""Copying (or hard-linking) files and trees so that no half file ever has its final name.

Each file is written to a temporary name in its destination directory and renamed over the
final name once whole. The temporary name is fixed for a given task and item (``tag``), so a
copy that a crash cut short leaves one leftover, which the next attempt overwrites and renames.
A tree is merged into the destination directory file by file, as rsync does; symbolic links
inside a tree are recreated as links, never followed, and other special files are skipped.

An existing destination file is handled by the item's ``overwrite`` policy (``base.py``):
under ``never`` the whole file is put in place with ``link(2)``, which refuses to replace
anything, so a file another writer put there meanwhile is not clobbered either; "the same
bytes" is a byte-for-byte comparison. Verifying compares the SHA-256 of the temporary file
with the source's, and with the expected digest, before it takes the final name.
"""

from __future__ import annotations

import errno
import filecmp
import hashlib
import logging
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from lodestream.platform_adapters.transfers.base import ItemOutcome
from lodestream.schemas.resources import Overwrite

logger = logging.getLogger("lodestream.platform_adapters.transfers")

# Failures no retry can mend. Anything else (EIO, a stale NFS handle, ...) may pass.
PERMANENT_ERRNOS: Final = frozenset({
    errno.ENOENT, errno.EACCES, errno.EPERM,  # no source; not allowed
    errno.ENOSPC, errno.EDQUOT, errno.EROFS,  # nowhere to write
    errno.EISDIR, errno.ENOTDIR, errno.ENAMETOOLONG, errno.ELOOP,  # the paths cannot work
})  # fmt: skip
# Why a hard link may fail where a copy works: another filesystem, a filesystem without hard
# links, too many links, or fs.protected_hardlinks refusing a file of another user.
LINK_FALLBACK_ERRNOS: Final = frozenset(
    {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EOPNOTSUPP, errno.ENOTSUP}
)
_PARTIAL_SUFFIX: Final = ".lode-partial"
_NAME_KEEP: Final = 150  # of the final name in the temporary one: names stop at 255 bytes


class NotCopyable(Exception):
    """The source is not something this item can copy (a directory without ``recursive``),
    or the destination may not take it (it differs and the policy is ``never``, its digest
    is not the expected one)."""


class Corrupted(Exception):
    """The copy's digest differs from its source's: moving it again may mend it."""


def outcome_of_error(exc: OSError | NotCopyable | Corrupted) -> ItemOutcome:
    """A failed item's outcome, permanent when retrying cannot help."""
    if isinstance(exc, NotCopyable):
        return ItemOutcome(ok=False, reason=str(exc), permanent=True)
    if isinstance(exc, Corrupted):
        return ItemOutcome(ok=False, reason=str(exc))
    return ItemOutcome(ok=False, reason=str(exc), permanent=exc.errno in PERMANENT_ERRNOS)


def item_tag(task_id: str, item_id: str) -> str:
    """What names one item of one task in its temporary file names."""
    return hashlib.sha256(f"{task_id}\0{item_id}".encode()).hexdigest()


def partial_name(destination: Path, tag: str) -> Path:
    """The temporary path a file bound for ``destination`` is written to first."""
    digest = hashlib.sha256(tag.encode()).hexdigest()[:12]
    return destination.with_name(f".{destination.name[:_NAME_KEEP]}.{digest}{_PARTIAL_SUFFIX}")


@dataclass
class Copier:
    """Copies one item; ``link`` hard-links files instead, falling back to a copy.

    ``tag`` names the task and item in temporary file names; ``written`` counts the bytes
    actually written (nothing for a hard link).
    """

    tag: str
    link: bool = False
    overwrite: Overwrite = "always"
    verify: bool = False
    sha256: str | None = None  # the item's expected digest (a file item)
    written: int = 0
    link_refused: str = ""  # why linking gave way to copying, once it has

    def copy_item(self, source: Path, destination: Path, *, recursive: bool) -> None:
        """Raises ``OSError`` (the system's own words) or ``NotCopyable``."""
        mode = source.stat().st_mode  # follows a link: the item names what it points to
        if stat.S_ISDIR(mode):
            if not recursive:
                raise NotCopyable(f"{source}: is a directory, and the item is not recursive")
            self._copy_tree(source, destination)
        elif recursive:
            raise NotCopyable(f"{source}: is not a directory, and the item is recursive")
        elif stat.S_ISREG(mode):
            self._copy_file(source, destination, expected=self.sha256)
        else:
            raise NotCopyable(f"{source}: is not a regular file")

    def _copy_tree(self, source: Path, destination: Path) -> None:
        destination.mkdir(parents=True, exist_ok=True)
        for entry in source.iterdir():
            target = destination / entry.name
            if entry.is_symlink():
                self._place_link(entry.readlink(), target)
            elif entry.is_dir():
                self._copy_tree(entry, target)
            elif entry.is_file():
                self._copy_file(entry, target)
            else:
                logger.info("local: skipping %s: not a regular file", entry)
        shutil.copystat(source, destination)  # last: writing its files changed its mtime

    def _copy_file(self, source: Path, destination: Path, *, expected: str | None = None) -> None:
        if destination.is_dir() and not destination.is_symlink():
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(destination))
        if destination.exists() and not self._replaces(source, destination):
            return
        destination.parent.mkdir(parents=True, exist_ok=True)
        partial = partial_name(destination, self.tag)
        partial.unlink(missing_ok=True)  # what an interrupted attempt left
        try:
            if not (self.link and self._linked(source, partial)):
                shutil.copy2(source, partial)
                self.written += partial.stat().st_size
            self._check(source, partial, expected)
            if self.overwrite != "never":
                partial.replace(destination)
                return
            try:
                os.link(partial, destination)  # refuses to replace what is there
            except FileExistsError:
                self._replaces(source, destination)  # the same bytes, or NotCopyable
        finally:
            partial.unlink(missing_ok=True)

    def _replaces(self, source: Path, destination: Path) -> bool:
        """Whether the policy replaces ``destination``; ``never`` raises if it differs."""
        if self.overwrite == "always":
            return True
        if self.overwrite == "if-newer":
            new, old = source.stat(), destination.stat()
            # rsync's --update: same mtime, replaced only if the size differs.
            return new.st_mtime_ns > old.st_mtime_ns or (
                new.st_mtime_ns == old.st_mtime_ns and new.st_size != old.st_size
            )
        if filecmp.cmp(source, destination, shallow=False):
            return False
        raise NotCopyable(
            f"{destination}: exists and differs from the source; kept (overwrite: never)"
        )

    def _check(self, source: Path, partial: Path, expected: str | None) -> None:
        if expected is None and not self.verify:
            return
        written = file_sha256(partial)
        if expected is not None and written != expected:
            raise NotCopyable(f"{source}: sha256 {written} is not the expected {expected}")
        if self.verify and (read := file_sha256(source)) != written:
            raise Corrupted(f"{source}: the copy's sha256 {written} is not the source's {read}")

    def _linked(self, source: Path, partial: Path) -> bool:
        if self.link_refused:
            return False
        try:
            partial.hardlink_to(source)
        except OSError as exc:
            if exc.errno not in LINK_FALLBACK_ERRNOS:
                raise
            self.link_refused = str(exc)
            logger.info("local: cannot hard-link %s (%s); copying instead", source, exc)
            return False
        return True

    def _place_link(self, target: Path, path: Path) -> None:
        if path.is_symlink() or path.exists():
            if self.overwrite == "never" and not (path.is_symlink() and path.readlink() == target):
                raise NotCopyable(
                    f"{path}: exists and is not the same link; kept (overwrite: never)"
                )
            if self.overwrite != "always":
                return
        partial = partial_name(path, self.tag)
        partial.unlink(missing_ok=True)
        partial.symlink_to(target)
        partial.replace(path)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
