"""The rsync backend: one rsync run per item, on this machine or over ssh.

Location URLs are ``rsync:/base`` (both sides on this machine; ``rsync:`` for no base) and
``rsync://[user@]host[:port]/base`` (the remote side over ssh; this is *not* rsync's daemon
protocol, whose URLs look the same). Remote paths are read under the base, as for ``local:``.

Why one run per item rather than one per batch with ``--files-from``: an item names its own
destination, which need not share the source's name or directory, and ``--files-from`` keeps
relative paths as they are; and a run per item has its own exit status, so each item gets its
own outcome without tying rsync's error lines back to files. A task's items move one after
another, so the module spreads a batch over several tasks (``spreads``). The ssh handshake a
run would pay is shared: ssh runs with ``ControlMaster=auto`` and ``ControlPersist`` (one
login per location while items keep coming), its socket under ``control_dir`` (the site's
directory) or, where that path is too long for a socket, under a private directory in /tmp.

Overwrite (``base.py``): ``always`` runs rsync as it is; ``if-newer`` adds ``--update``;
``never`` adds ``--ignore-existing`` with ``--info=skip2`` and ``--checksum``, whose words say
whether an existing file holds the source's bytes ("uptodate") or not ("sum change"): the
latter fails the item (``--checksum`` reads the source once more, the price of comparing
bytes rather than sizes and times). rsync would put a file inside a destination that is
a directory; the backend looks first (the site side in Python, the remote side with
``--list-only``) and fails the item instead. Verifying adds ``--checksum``; an expected digest
is checked on the site side: the file staged in (removed when it differs), or the file about
to be staged out.

Each run uses ``--partial-dir``: rsync writes a file under a temporary name and renames it when
whole; stopped by a signal, it keeps what it had in ``.lode-rsync-partial/`` beside the file and
the next run of the item resumes from it, then removes it. Only a SIGKILL to rsync's receiving
process can leave its temporary file (``.name.XXXXXX``) behind, never a file under its final
name. rsync runs with ``LC_ALL=C``: its words decide what is permanent (``rsync_output``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
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
from lodestream.platform_adapters.transfers.local_copy import file_sha256
from lodestream.platform_adapters.transfers.paths import ItemPaths, base_path, item_paths
from lodestream.platform_adapters.transfers.rsync_output import (
    error_words,
    item_outcome,
    kept_conflicts,
)
from lodestream.schemas.resources import Overwrite

PARTIAL_DIR: Final = ".lode-rsync-partial"
_HOST = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|[0-9A-Fa-f:.]+)$")
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_WAIT_S: Final = 0.2
_STOP_GRACE_S: Final = 10.0
# sun_path holds 108 bytes; ssh adds a 17-byte random suffix while it creates the socket.
SOCKET_PATH_MAX: Final = 104 - 17
_OPTION_VALUE: Final = {
    "--bwlimit": r"[0-9]+(?:\.[0-9]+)?[KMGkmg]?",
    "--compress-level": r"[0-9]",
    "--block-size": r"[0-9]+",
    "--chmod": r"[ugoaDF,=+rwxXst0-7-]+",
    "--exclude": r"[^\x00-\x1f]+",
    "--include": r"[^\x00-\x1f]+",
    "--skip-compress": r"[A-Za-z0-9/]+",
    "--max-size": r"[0-9]+[KMGkmg]?",
    "--min-size": r"[0-9]+[KMGkmg]?",
}
_OPTION_SWITCHES: Final = frozenset(
    {"--compress", "--whole-file", "--no-whole-file", "--sparse", "--ipv4", "--ipv6"}
)
ALLOWED_RSYNC_OPTIONS: Final = tuple(sorted([*_OPTION_SWITCHES, *(f"{o}=" for o in _OPTION_VALUE)]))


def rsync_option_problem(word: str) -> str | None:
    """Why ``word`` may not be one of a site's ``rsync_options``; None when it may.

    An allow-list: options that change where files go, what runs on the remote side, what is
    deleted or how partial files are kept (``--rsh``, ``--rsync-path``, ``--delete``,
    ``--inplace``, ...) are the backend's to set, never the settings'.
    """
    if word in _OPTION_SWITCHES:
        return None
    name, equals, value = word.partition("=")
    pattern = _OPTION_VALUE.get(name)
    if pattern is None or not equals:
        allowed = ", ".join(ALLOWED_RSYNC_OPTIONS)
        return f"rsync option {word!r} is not allowed (allowed: {allowed})"
    if not re.fullmatch(pattern, value):
        return f"rsync option {word!r}: {value!r} is not a value {name} takes here"
    return None


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
    overwrite: Overwrite = "always",
    verify: bool = False,
) -> list[str]:
    """The command line that moves one item.

    A file item follows a symbolic link it names (``--copy-links``); a tree keeps the links
    inside it as links. ``--mkpath`` creates the destination's missing directories.
    ``overwrite`` and ``verify``: see the module doc.
    """
    argv = [
        rsync, "--no-human-readable", "--stats", "--protect-args", "--mkpath",
        "--times", "--perms", f"--partial-dir={PARTIAL_DIR}", f"--timeout={io_timeout_s}",
    ]  # fmt: skip
    argv += ["--recursive", "--links"] if recursive else ["--copy-links"]
    if overwrite == "if-newer":
        argv.append("--update")
    elif overwrite == "never":
        # --checksum: "the same bytes", as on every backend, not rsync's size-and-mtime.
        argv += ["--ignore-existing", "--info=skip2", "--checksum"]
    elif verify:
        argv.append("--checksum")
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
    ``rsync_options`` are added to every run (``--bwlimit=10m``; see ``rsync_option_problem``).
    ``control_dir`` holds the ssh connection's socket, shared by the runs for
    ``control_persist_s`` after the last (0: each run logs in on its own).
    """

    name = "rsync"
    spreads = True

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
        control_dir: Path | None = None,
        control_persist_s: int = 60,
        max_workers: int = 4,
    ) -> None:
        self.location = RsyncLocation.parse(url)
        for word in rsync_options:
            if problem := rsync_option_problem(word):
                raise ValueError(problem)
        self.rsync = rsync
        self.ssh = ssh
        self.identity_file = identity_file
        self.ssh_options = tuple(ssh_options)
        self.rsync_options = tuple(rsync_options)
        self.io_timeout_s = io_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.control_path: Path | None = None
        if self.location.host is not None and control_persist_s > 0:
            self.control_path = control_socket(control_dir or Path(state_dir), self.location)
        self.control_persist_s = control_persist_s
        super().__init__(state_dir, max_workers=max_workers)

    def ssh_argv(self, location: RsyncLocation) -> list[str]:
        argv = [self.ssh, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.connect_timeout_s}"]
        if location.port is not None:
            argv += ["-p", str(location.port)]
        if self.identity_file is not None:
            argv += ["-i", str(self.identity_file), "-o", "IdentitiesOnly=yes"]
        if self.control_path is not None:
            argv += [
                "-o", "ControlMaster=auto", "-o", f"ControlPath={self.control_path}",
                "-o", f"ControlPersist={self.control_persist_s}",
            ]  # fmt: skip
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
        paths = item_paths(batch, item, location.base)
        before = self._before(location, paths, item, context)
        if before is not None:
            return before
        argv = render_rsync_argv(
            self.rsync, location, paths, recursive=item.recursive,
            ssh_argv=self.ssh_argv(location), io_timeout_s=self.io_timeout_s,
            rsync_options=self.rsync_options, overwrite=item.overwrite, verify=item.verify,
        )  # fmt: skip
        ran = self._rsync(argv, context)
        if isinstance(ran, ItemOutcome):
            return ran
        returncode, stdout, stderr = ran
        if returncode != 0 and context.stopping.is_set():
            return None  # stopped by close(): the next backend moves it again
        if returncode != 0 and context.cancelled.is_set():
            return ItemOutcome(ok=False, reason=f"cancelled while rsync ran: {error_words(stderr)}")
        # Done before a stop or cancel could take effect: moved, and recorded as such.
        return _after(paths, item, item_outcome(returncode, stdout, stderr), stdout)

    def _before(
        self, location: RsyncLocation, paths: ItemPaths, item: TransferItem, context: RunContext
    ) -> ItemOutcome | None:
        """What fails the item before rsync runs: a file bound for a directory, a file to
        stage out that is not the one the job expects."""
        if not item.recursive:
            if paths.remote_source or location.host is None:
                is_dir = Path(paths.destination).is_dir()
            else:
                is_dir = self._remote_is_dir(location, paths.destination, context)
            if is_dir:
                return ItemOutcome(
                    ok=False, permanent=True,
                    reason=f"rsync: {paths.destination}: {os.strerror(errno.EISDIR)}",
                )  # fmt: skip
        if item.sha256 and not paths.remote_source:
            return _expected_digest(Path(paths.source), item.sha256, remove=False)
        return None

    def _remote_is_dir(self, location: RsyncLocation, path: str, context: RunContext) -> bool:
        rsh = shlex.join(self.ssh_argv(location))
        operand = location.operand(path, remote=True, directory=False)
        argv = [self.rsync, "--list-only", "--protect-args", "--rsh", rsh, "--", operand]
        ran = self._rsync(argv, context)
        if not isinstance(ran, tuple) or ran[0] != 0:
            return False  # absent or unreadable: the run itself says so
        return ran[1].startswith("d")

    def _rsync(self, argv: list[str], context: RunContext) -> tuple[int, str, str] | ItemOutcome:
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
        return proc.returncode, stdout, stderr

    def close(self, *, wait: bool = True) -> None:
        """Stop the tasks, then the shared ssh connection (its master would linger)."""
        super().close(wait=wait)
        if self.control_path is None or not self.control_path.exists():
            return
        argv = [*self.ssh_argv(self.location), "-O", "exit", self.location.host or ""]
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(argv, capture_output=True, timeout=10, check=False)


def control_socket(directory: Path, location: RsyncLocation) -> Path:
    """Where ssh keeps the shared connection to ``location``: under ``directory`` unless that
    path is too long for a socket, then under a private directory in the system's /tmp."""
    place = f"{location.user}@{location.host}:{location.port}"
    name = "cm-" + hashlib.sha256(place.encode()).hexdigest()[:16]
    if len(os.fsencode(directory / name)) > SOCKET_PATH_MAX:
        digest = hashlib.sha256(os.fsencode(directory.resolve())).hexdigest()[:12]
        directory = Path(tempfile.gettempdir()) / f"lode-ssh-{os.getuid()}-{digest}"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return directory / name


def _expected_digest(path: Path, expected: str, *, remove: bool) -> ItemOutcome | None:
    """A failed outcome when ``path`` is not the file the job expects (removed if ``remove``)."""
    try:
        actual = file_sha256(path)
    except OSError as exc:
        return ItemOutcome(ok=False, reason=f"rsync: cannot read {path}: {exc}",
                           permanent=exc.errno == errno.ENOENT)  # fmt: skip
    if actual == expected:
        return None
    if remove:
        path.unlink(missing_ok=True)
    return ItemOutcome(
        ok=False, permanent=True,
        reason=f"{path}: sha256 {actual} is not the expected {expected}",
    )  # fmt: skip


def _after(paths: ItemPaths, item: TransferItem, outcome: ItemOutcome, stdout: str) -> ItemOutcome:
    """A run's outcome, failed where it kept a file that differs or moved an unexpected one."""
    if not outcome.ok:
        return outcome
    if conflicts := kept_conflicts(stdout):
        return ItemOutcome(
            ok=False, permanent=True,
            reason=f"rsync: {paths.destination}: {conflicts[0]} exists and differs from the "
            f"source; kept (overwrite: never){_more(conflicts)}",
        )  # fmt: skip
    if item.sha256 and paths.remote_source:
        return _expected_digest(Path(paths.destination), item.sha256, remove=True) or outcome
    return outcome


def _more(names: Sequence[str]) -> str:
    return f" (and {len(names) - 1} more)" if len(names) > 1 else ""


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
