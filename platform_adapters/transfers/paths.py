"""Where a batch's paths point: the remote side under the location's base, the site side as is.

A location URL may name a base directory (``local:/data/in``, ``rsync://u@h/scratch``): the
remote paths of its items are then read under it, as a client of that location sees the
location's root. The base is a boundary for names, checked lexically (``..`` may not climb out
of it); it is not a sandbox, since a symbolic link inside it is followed like any other path.

A remote path is judged by the rule the api applies at submission
(:func:`lodestream.schemas.xfer.remote_path_problem`), again here: what reaches a backend may
have been written to the log by anyone the log trusts, not only by the api.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from lodestream.platform_adapters.transfers.base import (
    TransferBatch,
    TransferItem,
    TransferRefused,
)
from lodestream.schemas.xfer import remote_path_problem


def base_path(url: str, path: str) -> str | None:
    """The base directory a URL names (``path`` is the URL's path part), or None for none."""
    if path in {"", "/"}:
        return None
    if not path.startswith("/") or "\0" in path:
        raise TransferRefused(f"{url}: the base directory {path!r} is not an absolute path")
    if ".." in path.split("/"):
        raise TransferRefused(f"{url}: the base directory {path!r} may not contain '..'")
    return posixpath.normpath(path)


def under_base(url: str, base: str | None, path: str) -> str:
    """``path`` (absolute, as the batch names it on the location) read under ``base``.

    Raises ``TransferRefused`` for a path the shared rule refuses (relative, a control
    character) or one whose ``..`` climbs out of the base.
    """
    problem = remote_path_problem(path)
    if problem is not None:
        raise TransferRefused(f"{url}: {problem}")
    if base is None:
        return posixpath.normpath(path)
    resolved = posixpath.normpath(posixpath.join(base, path.lstrip("/")))
    if resolved != base and not resolved.startswith(base.rstrip("/") + "/"):
        raise TransferRefused(f"{url}: the path {path!r} climbs out of the location's base {base}")
    return resolved


def site_path(url: str, path: str) -> str:
    """A site-side path, used as given once it is known to be absolute."""
    _require_absolute(url, path, "site")
    return path


def _require_absolute(url: str, path: str, side: str) -> None:
    if not path.startswith("/") or "\0" in path:
        raise TransferRefused(f"{url}: the {side} path {path!r} is not an absolute path")


@dataclass(frozen=True, slots=True)
class ItemPaths:
    """Where one item is read and written; ``remote_source`` tells which side is remote."""

    source: str
    destination: str
    remote_source: bool


def item_paths(batch: TransferBatch, item: TransferItem, base: str | None) -> ItemPaths:
    """The item's source and destination with the remote one read under ``base``."""
    if batch.direction == "in":
        return ItemPaths(
            source=under_base(batch.url, base, item.source),
            destination=site_path(batch.url, item.destination),
            remote_source=True,
        )
    return ItemPaths(
        source=site_path(batch.url, item.source),
        destination=under_base(batch.url, base, item.destination),
        remote_source=False,
    )
