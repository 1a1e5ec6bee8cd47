"""The rsync backend: one rsync run per item, on this machine or over ssh.

Location URLs are ``rsync:/base`` (both sides on this machine; ``rsync:`` for no base) and
``rsync://[user@]host[:port]/base`` (the remote side over ssh; this is *not* rsync's daemon
protocol, whose URLs look the same). Remote paths are read under the base, as for ``local:``.

Why one run per item rather than one per batch with ``--files-from``: an item names its own
destination, which need not share the source's name or directory, and ``--files-from`` keeps
relative paths as they are; and a run per item has its own exit status, so each item gets its
own outcome without tying rsync's error lines back to files. The price is an ssh handshake per
item; ``ssh_options`` can add ``ControlMaster``/``ControlPersist`` where that matters.

Each run uses ``--partial-dir``: rsync writes a file under a temporary name and renames it when
whole; stopped by a signal, it keeps what it had in ``.lode-rsync-partial/`` beside the file and
the next run of the item resumes from it, then removes it. Only a SIGKILL to rsync's receiving
process can leave its temporary file (``.name.XXXXXX``) behind, never a file under its final
name. rsync runs with ``LC_ALL=C``: its words decide what is permanent (``rsync_output``).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import unquote, urlsplit

from lodestream.platform_adapters.transfers.background import BackgroundBackend, RunContext
from lodestream.platform_adapters.transfers.base import (
    ItemOutcome,
    TransferBatch,
    TransferItem,
    TransferRefused,
    TransferUnavailable,
)
from lodestream.platform_adapters.transfers.paths import ItemPaths, base_path, item_paths
from lodestream.platform_adapters.transfers.rsync_output import error_words, item_outcome

PARTIAL_DIR: Final = ".lode-rsync-partial"
_HOST = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|[0-9A-Fa-f:.]+)$")
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_WAIT_S: Final = 0.2
_STOP_GRACE_S: Final = 10.0


@dataclass(frozen=True, slots=True)
class RsyncLocation:
    url: str
    base: str | None  # remote paths are read under it; None: as they are
    host: str | None = None  # None: the remote side is this machine
    user: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, url: str) -> RsyncLocation:
        """``rsync:/base`` or ``rsync://[user@]host[:port]/base``; ``TransferRefused`` else."""
        parts = urlsplit(url)
        if parts.scheme != "rsync" or parts.query or parts.fragment:
            raise TransferRefused(
                f"{url!r} is not an rsync location (rsync:/base or rsync://user@host:port/base)"
            )
        if not url.startswith("rsync://"):
            return cls(url, base_path(url, parts.path))
        host = parts.hostname or ""
        try:
            port = parts.port
        except ValueError as exc:
            raise TransferRefused(f"{url!r}: {exc}") from None
        user = unquote(parts.username) if parts.username is not None else None
        if not _HOST.fullmatch(host):
            raise TransferRefused(f"{url!r}: {host!r} is not a host name or address")
        if user is not None and not _USER.fullmatch(user):
            raise TransferRefused(f"{url!r}: {user!r} is not a user name")
        if parts.password is not None:
            raise TransferRefused(f"{url!r}: no password in the URL; ssh uses keys")
        return cls(url, base_path(url, parts.path), host, user, port)

    @property
    def place(self) -> tuple[str | None, str | None, str | None, int | None]:
        """What tells two URLs of the same location apart from two locations."""
        return (self.base, self.host, self.user, self.port)

    def operand(self, path: str, *, remote: bool, directory: bool) -> str:
        """A path as rsync's command line names it: ``user@host:path`` on the remote side.

        A directory gets a trailing slash: its contents go into the destination directory.
        """
        text = path.rstrip("/") + "/" if directory else path
        if not remote or self.host is None:
            return text
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.user}@{host}:{text}" if self.user else f"{host}:{text}"


def render_rsync_argv(
    rsync: str,
    location: RsyncLocation,
    paths: ItemPaths,
    *,
    recursive: bool,
    ssh_argv: Sequence[str] = (),
    io_timeout_s: int = 300,
    rsync_options: Sequence[str] = (),
) -> list[str]:
    """The command line that moves one item.

    A file item follows a symbolic link it names (``--copy-links``); a tree keeps the links
    inside it as links. ``--mkpath`` creates the destination's missing directories.
    """
    argv = [
        rsync, "--no-human-readable", "--stats", "--protect-args", "--mkpath",
        "--times", "--perms", f"--partial-dir={PARTIAL_DIR}", f"--timeout={io_timeout_s}",
    ]  # fmt: skip
    argv += ["--recursive", "--links"] if recursive else ["--copy-links"]
    if location.host is not None:
        argv += ["--rsh", shlex.join(ssh_argv)]
    source = location.operand(paths.source, remote=paths.remote_source, directory=recursive)
    destination = location.operand(
        paths.destination, remote=not paths.remote_source, directory=recursive
    )
    return [*argv, *rsync_options, "--", source, destination]


class RsyncBackend(BackgroundBackend):
    """Moves items with rsync (see the module doc).

    ``identity_file`` and ``ssh_options`` (extra ssh arguments, e.g. ``("-o",
    "UserKnownHostsFile=/site/known_hosts")``) apply to ``rsync://`` locations; ssh runs
    with ``BatchMode=yes``, so it never waits for a password or a host key question.
    ``rsync_options`` are added to every run (``--bwlimit=10m``).
    """

    name = "rsync"

    def __init__(
        self,
        url: str,
        *,
        state_dir: Path,
        rsync: str = "rsync",
        ssh: str = "ssh",
        identity_file: Path | None = None,
        ssh_options: Sequence[str] = (),
        rsync_options: Sequence[str] = (),
        io_timeout_s: int = 300,
        connect_timeout_s: int = 30,
        max_workers: int = 4,
    ) -> None:
        self.location = RsyncLocation.parse(url)
        self.rsync = rsync
        self.ssh = ssh
        self.identity_file = identity_file
        self.ssh_options = tuple(ssh_options)
        self.rsync_options = tuple(rsync_options)
        self.io_timeout_s = io_timeout_s
        self.connect_timeout_s = connect_timeout_s
        super().__init__(state_dir, max_workers=max_workers)

    def ssh_argv(self, location: RsyncLocation) -> list[str]:
        argv = [self.ssh, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.connect_timeout_s}"]
        if location.port is not None:
            argv += ["-p", str(location.port)]
        if self.identity_file is not None:
            argv += ["-i", str(self.identity_file), "-o", "IdentitiesOnly=yes"]
        return [*argv, *self.ssh_options]

    def check_batch(self, batch: TransferBatch) -> None:
        location = RsyncLocation.parse(batch.url)
        if location.place != self.location.place:
            raise TransferRefused(
                f"rsync: this backend serves {self.location.url}, not {batch.url}"
            )
        for item in batch.items:
            self.check_item(batch, item)
        if shutil.which(self.rsync) is None:
            raise TransferUnavailable(f"rsync: {self.rsync!r} is not on PATH: install rsync")
        if location.host is None:
            return
        if shutil.which(self.ssh) is None:
            raise TransferUnavailable(f"rsync: {self.ssh!r} is not on PATH: install openssh-client")
        if self.identity_file is not None and not os.access(self.identity_file, os.R_OK):
            raise TransferUnavailable(f"rsync: cannot read the ssh identity {self.identity_file}")

    def check_item(self, batch: TransferBatch, item: TransferItem) -> None:
        item_paths(batch, item, RsyncLocation.parse(batch.url).base)  # refuses a bad path

    def move_item(
        self, batch: TransferBatch, item: TransferItem, context: RunContext
    ) -> ItemOutcome | None:
        location = RsyncLocation.parse(batch.url)
        argv = render_rsync_argv(
            self.rsync,
            location,
            item_paths(batch, item, location.base),
            recursive=item.recursive,
            ssh_argv=self.ssh_argv(location),
            io_timeout_s=self.io_timeout_s,
            rsync_options=self.rsync_options,
        )
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**os.environ, "LC_ALL": "C"},
                encoding="utf-8",
                errors="replace",
            )
        except OSError as exc:
            return ItemOutcome(ok=False, reason=f"rsync: cannot run {argv[0]}: {exc}")
        stdout, stderr = _communicate(proc, context)
        if proc.returncode != 0 and context.stopping.is_set():
            return None  # stopped by close(): the next backend moves it again
        if proc.returncode != 0 and context.cancelled.is_set():
            return ItemOutcome(ok=False, reason=f"cancelled while rsync ran: {error_words(stderr)}")
        # Done before a stop or cancel could take effect: moved, and recorded as such.
        return item_outcome(proc.returncode, stdout, stderr)


def _communicate(proc: subprocess.Popen[str], context: RunContext) -> tuple[str, str]:
    """Wait for rsync, stopping it (SIGTERM: it keeps its partial file) if the task is."""
    stopped_at: float | None = None
    while True:
        try:
            return proc.communicate(timeout=_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
        if stopped_at is None and context.interrupted:
            proc.terminate()
            stopped_at = time.monotonic()
        elif stopped_at is not None and time.monotonic() - stopped_at > _STOP_GRACE_S:
            proc.kill()
