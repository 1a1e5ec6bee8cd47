"""The local backend: copy (or hard-link) between filesystems this machine mounts.

Location URLs are ``local:`` (remote paths are absolute paths on this machine) or
``local:/base/dir`` (remote paths are read under ``/base/dir``; ``..`` may not climb out).
Files are copied with their mode and mtime; with ``link=True`` they are hard-linked instead,
and copied where a link cannot be made (another filesystem, say), the reason logged. A linked
file *is* its source: a job that writes into a staged-in link writes into the source.

Tasks run in a thread pool and are kept under ``state_dir/local/`` (see ``background``). The
task id is the batch's submission key, so a batch submitted twice is moved once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from lodestream.platform_adapters.transfers.background import BackgroundBackend, RunContext
from lodestream.platform_adapters.transfers.base import (
    ItemOutcome,
    TransferBatch,
    TransferItem,
    TransferRefused,
)
from lodestream.platform_adapters.transfers.local_copy import (
    Copier,
    Corrupted,
    NotCopyable,
    item_tag,
    outcome_of_error,
)
from lodestream.platform_adapters.transfers.paths import base_path, item_paths


@dataclass(frozen=True, slots=True)
class LocalLocation:
    url: str
    base: str | None  # remote paths are read under it; None: as they are

    @classmethod
    def parse(cls, url: str) -> LocalLocation:
        """``local:`` or ``local:/base/dir``; ``TransferRefused`` for anything else."""
        parts = urlsplit(url)
        if parts.scheme != "local" or parts.netloc or parts.query or parts.fragment:
            raise TransferRefused(f"{url!r} is not a local location (local: or local:/base/dir)")
        if url.startswith("local://"):
            raise TransferRefused(f"{url!r}: a local location names no host (local:/base/dir)")
        return cls(url, base_path(url, parts.path))


class LocalBackend(BackgroundBackend):
    """Moves items within this machine's filesystems (see the module doc)."""

    name = "local"
    spreads = True

    def __init__(
        self, url: str, *, state_dir: Path, link: bool = False, max_workers: int = 4
    ) -> None:
        self.location = LocalLocation.parse(url)
        self.link = link
        super().__init__(state_dir, max_workers=max_workers)

    def check_batch(self, batch: TransferBatch) -> None:
        location = LocalLocation.parse(batch.url)
        if location.base != self.location.base:
            raise TransferRefused(
                f"local: this backend serves {self.location.url}, not {batch.url}"
            )
        for item in batch.items:
            self.check_item(batch, item)

    def check_item(self, batch: TransferBatch, item: TransferItem) -> None:
        item_paths(batch, item, LocalLocation.parse(batch.url).base)  # refuses a bad path

    def move_item(
        self, batch: TransferBatch, item: TransferItem, context: RunContext
    ) -> ItemOutcome | None:
        paths = item_paths(batch, item, LocalLocation.parse(batch.url).base)
        copier = Copier(
            item_tag(context.task_id, item.item_id), link=self.link, overwrite=item.overwrite,
            verify=item.verify, sha256=item.sha256,
        )  # fmt: skip
        try:
            copier.copy_item(Path(paths.source), Path(paths.destination), recursive=item.recursive)
        except (OSError, NotCopyable, Corrupted) as exc:
            return outcome_of_error(exc)
        return ItemOutcome(ok=True, bytes_transferred=copier.written)
