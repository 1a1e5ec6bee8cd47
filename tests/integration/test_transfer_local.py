"""What the local backend adds to the shared suite: hard links, the base as a boundary, tasks
taken up again after a crash, and the failures no retry mends."""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from lodestream.platform_adapters.transfers.background import CANCELLED_REASON
from lodestream.platform_adapters.transfers.base import (
    ItemOutcome,
    TransferBatch,
    TransferItem,
    TransferRefused,
)
from lodestream.platform_adapters.transfers.local import LocalBackend
from lodestream.platform_adapters.transfers.local_copy import item_tag, partial_name
from lodestream.platform_adapters.transfers.task_store import TaskStore
from tests.support.transfer_contract import TransferHarness, write


@contextmanager
def local_harness(
    tmp_path: Path, remote_root: Path | None = None, *, link: bool = False
) -> Iterator[TransferHarness]:
    remote_root = remote_root or tmp_path / "remote"
    url = f"local:{remote_root}"
    harness = TransferHarness(
        url=url,
        remote_root=remote_root,
        site_root=tmp_path / "site",
        make_backend=lambda: LocalBackend(url, state_dir=tmp_path / "state", link=link),
    )
    try:
        yield harness
    finally:
        harness.close()


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[TransferHarness]:
    with local_harness(tmp_path) as harness:
        yield harness


@contextmanager
def tmpfs(path: Path, size: str, *options: str) -> Iterator[Path]:
    """A small tmpfs at ``path``; the test is skipped where mounting is not allowed."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *options]), "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_hard_links_share_the_source_and_write_nothing(tmp_path: Path) -> None:
    with local_harness(tmp_path, link=True) as harness:
        source = write(harness.remote_root / "big.dat", b"x" * 10_000)
        destination = tmp_path / "site" / "big.dat"
        item = TransferItem("i-link", "/big.dat", str(destination))
        status = harness.wait_final(harness.backend.submit(harness.batch("in", [item])))
    assert status.items["i-link"] == ItemOutcome(ok=True, bytes_transferred=0)
    assert destination.stat().st_ino == source.stat().st_ino


def test_a_hard_link_across_filesystems_falls_back_to_a_copy_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="lodestream.platform_adapters.transfers")
    with (
        _other_filesystem(tmp_path) as elsewhere,
        local_harness(tmp_path, elsewhere, link=True) as harness,
    ):
        write(elsewhere / "tree" / "a.txt", b"aaa")
        write(elsewhere / "tree" / "b.txt", b"bb")
        item = TransferItem("i-x", "/tree", str(tmp_path / "site" / "tree"), recursive=True)
        status = harness.wait_final(harness.backend.submit(harness.batch("in", [item])))
        source_inode = (elsewhere / "tree" / "a.txt").stat().st_ino
    assert status.items["i-x"] == ItemOutcome(ok=True, bytes_transferred=5)
    assert (tmp_path / "site" / "tree" / "a.txt").read_bytes() == b"aaa"
    assert (tmp_path / "site" / "tree" / "a.txt").stat().st_ino != source_inode
    refusals = [r.getMessage() for r in caplog.records if "cannot hard-link" in r.getMessage()]
    assert len(refusals) == 1  # once per item, not once per file
    assert "Invalid cross-device link" in refusals[0]


@contextmanager
def _other_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A directory on another filesystem than ``tmp_path``: /dev/shm, or a tmpfs we mount."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shm.stat().st_dev != tmp_path.stat().st_dev:
        with tempfile.TemporaryDirectory(dir=shm, prefix="lode-xfer-") as other:
            yield Path(other)
        return
    with tmpfs(tmp_path / "other", "1m") as other:
        yield other


def test_paths_outside_the_base_are_refused_and_nothing_is_recorded(
    harness: TransferHarness, tmp_path: Path
) -> None:
    for source, destination in [("/../secret", "/site/x"), ("/ok", "relative/x")]:
        item = TransferItem("i-bad", source, destination)
        with pytest.raises(TransferRefused):
            harness.backend.submit(harness.batch("in", [item], key="bad-1"))
    out = TransferItem("i-out", str(tmp_path / "site" / "r"), "/a/../../../etc/cron.d/x")
    with pytest.raises(TransferRefused, match="climbs out"):
        harness.backend.submit(harness.batch("out", [out], key="bad-2"))
    assert not (tmp_path / "state" / "local").exists() or not any(
        (tmp_path / "state" / "local").iterdir()
    )


def test_a_batch_for_another_location_or_a_reused_key_is_refused(
    harness: TransferHarness, tmp_path: Path
) -> None:
    item = TransferItem("i-1", "/a", str(tmp_path / "site" / "a"))
    other = TransferBatch("elsewhere", "local:/elsewhere", "in", (item,), "loc-1")
    with pytest.raises(TransferRefused, match="serves"):
        harness.backend.submit(other)
    write(harness.remote_root / "a", b"a")
    harness.wait_final(harness.backend.submit(harness.batch("in", [item], key="reused")))
    changed = TransferItem("i-1", "/a", str(tmp_path / "site" / "b"))
    with pytest.raises(TransferRefused, match="different batch"):
        harness.backend.submit(harness.batch("in", [changed], key="reused"))


def test_a_task_cut_short_by_a_crash_is_taken_up_again_without_redoing_settled_items(
    harness: TransferHarness, tmp_path: Path
) -> None:
    write(harness.remote_root / "one.txt", b"one")
    write(harness.remote_root / "two.txt", b"two, whole")
    one, two = tmp_path / "site" / "one.txt", tmp_path / "site" / "two.txt"
    batch = harness.batch(
        "in",
        [TransferItem("i-1", "/one.txt", str(one)), TransferItem("i-2", "/two.txt", str(two))],
        key="crashed-1",
    )
    # What a site agent that died mid-task leaves: item 1 recorded as moved (its file has
    # since been removed, so moving it again would show), item 2 half written.
    store = TaskStore(tmp_path / "state" / "local", "local")
    store.save(store.create(batch).settled("i-1", ItemOutcome(ok=True, bytes_transferred=3)))
    half = partial_name(two, item_tag("crashed-1", "i-2"))
    write(half, b"two, ha")
    status = harness.wait_final("crashed-1", harness.restart())
    assert status.items["i-1"] == ItemOutcome(ok=True, bytes_transferred=3)
    assert status.items["i-2"] == ItemOutcome(ok=True, bytes_transferred=10)
    assert not one.exists()
    assert two.read_bytes() == b"two, whole"
    assert sorted(p.name for p in two.parent.iterdir()) == ["two.txt"]


def test_a_cancel_asked_before_a_restart_is_honoured_after_it(
    harness: TransferHarness, tmp_path: Path
) -> None:
    write(harness.remote_root / "c.txt", b"c")
    items = [TransferItem(f"i-{n}", "/c.txt", str(tmp_path / "site" / f"c{n}")) for n in (1, 2)]
    batch = harness.batch("in", items, key="cancel-1")
    TaskStore(tmp_path / "state" / "local", "local").create(batch)  # recorded, never run
    harness.backend.cancel("cancel-1")
    status = harness.wait_final("cancel-1", harness.restart())
    assert status.items == {
        "i-1": ItemOutcome(ok=False, reason=CANCELLED_REASON),
        "i-2": ItemOutcome(ok=False, reason=CANCELLED_REASON),
    }
    assert "cancelled" in status.detail
    assert not (tmp_path / "site" / "c1").exists()


def test_no_space_left_is_permanent_and_leaves_no_partial_file(
    harness: TransferHarness, tmp_path: Path
) -> None:
    write(harness.remote_root / "big.bin", b"\0" * 300_000)
    with tmpfs(tmp_path / "small", "64k") as small:
        item = TransferItem("i-big", "/big.bin", str(small / "big.bin"))
        status = harness.wait_final(harness.backend.submit(harness.batch("in", [item])))
        assert list(small.iterdir()) == []
    outcome = status.items["i-big"]
    assert (outcome.ok, outcome.permanent) == (False, True)
    assert "No space left on device" in outcome.reason


def test_a_read_only_destination_is_permanent(harness: TransferHarness, tmp_path: Path) -> None:
    write(harness.remote_root / "f.txt", b"f")
    with tmpfs(tmp_path / "ro", "64k", "ro") as read_only:
        item = TransferItem("i-ro", "/f.txt", str(read_only / "f.txt"))
        status = harness.wait_final(harness.backend.submit(harness.batch("in", [item])))
    assert status.items["i-ro"].permanent
    assert "Read-only file system" in status.items["i-ro"].reason


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file: no permission to deny")
def test_an_unreadable_source_is_permanent(harness: TransferHarness, tmp_path: Path) -> None:
    write(harness.remote_root / "secret", b"s").chmod(0)
    item = TransferItem("i-s", "/secret", str(tmp_path / "site" / "secret"))
    status = harness.wait_final(harness.backend.submit(harness.batch("in", [item])))
    assert status.items["i-s"].permanent
    assert "Permission denied" in status.items["i-s"].reason


def test_a_tree_keeps_its_links_and_times_and_merges_into_what_is_there(
    harness: TransferHarness, tmp_path: Path
) -> None:
    tree = harness.remote_root / "tree"
    data = write(tree / "data.txt", b"data")
    os.utime(data, (1_600_000_000, 1_600_000_000))
    (tree / "link-to-data").symlink_to("data.txt")
    (tree / "outside").symlink_to("/etc/hostname")
    destination = tmp_path / "site" / "tree"
    write(destination / "already-here.txt", b"kept")
    item = TransferItem("i-t", "/tree", str(destination), recursive=True)
    status = harness.wait_final(harness.backend.submit(harness.batch("in", [item])))
    assert status.items["i-t"] == ItemOutcome(ok=True, bytes_transferred=4)
    assert (destination / "already-here.txt").read_bytes() == b"kept"
    assert (destination / "link-to-data").readlink() == Path("data.txt")
    assert (destination / "outside").readlink() == Path("/etc/hostname")  # a link, not a copy
    assert (destination / "data.txt").stat().st_mtime == 1_600_000_000


def test_a_file_item_naming_a_link_copies_what_it_points_to(
    harness: TransferHarness, tmp_path: Path
) -> None:
    write(harness.remote_root / "v3" / "input.dat", b"version 3")
    (harness.remote_root / "current.dat").symlink_to("v3/input.dat")
    destination = tmp_path / "site" / "input.dat"
    item = TransferItem("i-l", "/current.dat", str(destination))
    assert harness.wait_final(harness.backend.submit(harness.batch("in", [item]))).items["i-l"].ok
    assert not destination.is_symlink()
    assert destination.read_bytes() == b"version 3"


def test_a_recursive_item_naming_a_file_fails_for_good(
    harness: TransferHarness, tmp_path: Path
) -> None:
    write(harness.remote_root / "plain.txt", b"p")
    item = TransferItem("i-p", "/plain.txt", str(tmp_path / "site" / "p"), recursive=True)
    outcome = harness.wait_final(harness.backend.submit(harness.batch("in", [item]))).items["i-p"]
    assert (outcome.ok, outcome.permanent) == (False, True)
    assert "is not a directory" in outcome.reason
