"""One test suite for every transfer backend: what ``TransferBackend`` promises (base.py).

A backend plugs in with a harness that makes backend objects and says where the location's
files are seen from this machine, and a test class that inherits the suite::

    class TestRsyncContract(TransferContract):
        @pytest.fixture
        def harness(self, tmp_path):
            harness = TransferHarness(
                url=f"rsync:{tmp_path / 'remote'}",
                remote_root=tmp_path / "remote",
                site_root=tmp_path / "site",
                make_backend=lambda: RsyncBackend(f"rsync:{tmp_path / 'remote'}",
                                                  state_dir=tmp_path / "state"),
            )
            yield harness
            harness.close()  # closes every backend object the test made

Remote paths in batches are absolute paths under the location's base: the file the test
writes at ``remote_root / "data/a.txt"`` is ``/data/a.txt`` in a batch. ``make_backend``
builds a new object on the same state each call; the suite calls it again to play a site
agent that restarted. Tests poll; ``timeout_s`` bounds each wait.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lodestream.platform_adapters.transfers.base import (
    Direction,
    ItemOutcome,
    TaskStatus,
    TransferBackend,
    TransferBatch,
    TransferItem,
    TransferRefused,
    UnknownTask,
)
from lodestream.schemas.resources import Overwrite

_POLL_S = 0.05
_keys = itertools.count(1)


def close_if_closable(backend: TransferBackend) -> None:
    close = getattr(backend, "close", None)
    if callable(close):
        close()


@dataclass
class TransferHarness:
    url: str
    remote_root: Path  # the location's base, as this machine sees it
    site_root: Path  # where site-side paths (a job's workdir) live
    make_backend: Callable[[], TransferBackend]
    # How a backend object is stopped once the test is done with it (``close()`` if it has one).
    close_backend: Callable[[TransferBackend], None] = close_if_closable
    missing_words: str = "No such file or directory"  # how the backend says a source is absent
    reports_bytes: bool = True  # bytes_transferred is the size written (else it may be None)
    timeout_s: float = 30.0
    backends: list[TransferBackend] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.remote_root.mkdir(parents=True, exist_ok=True)
        self.site_root.mkdir(parents=True, exist_ok=True)
        self.backend = self.restart()

    def restart(self) -> TransferBackend:
        """A new backend object on the same state, as after a site agent restart."""
        backend = self.make_backend()
        self.backends.append(backend)
        return backend

    def close(self) -> None:
        for backend in self.backends:
            self.close_backend(backend)

    def remote(self, relative: str) -> str:
        """How a batch names the location's file at ``remote_root / relative``."""
        return "/" + relative

    def batch(
        self, direction: Direction, items: Sequence[TransferItem], key: str | None = None
    ) -> TransferBatch:
        return TransferBatch(
            location="contract",
            url=self.url,
            direction=direction,
            items=tuple(items),
            submission_key=key or f"contract-{time.time_ns()}-{next(_keys)}",
        )

    def wait_final(self, task_id: str, backend: TransferBackend | None = None) -> TaskStatus:
        backend = backend or self.backend
        deadline = time.monotonic() + self.timeout_s
        while True:
            status = backend.poll(task_id)
            if status.final:
                return status
            if time.monotonic() > deadline:
                pytest.fail(f"task {task_id} not final after {self.timeout_s} s: {status}")
            time.sleep(_POLL_S)


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


class TransferContract:
    """The shared suite; a subclass provides the ``harness`` fixture (see the module doc)."""

    @pytest.fixture
    def harness(self) -> Iterator[TransferHarness]:
        raise NotImplementedError("a backend's test class provides the harness fixture")

    def test_stage_in_moves_the_files_with_their_bytes(self, harness: TransferHarness) -> None:
        first = write(harness.remote_root / "data" / "a.txt", b"alpha\n")
        second = write(harness.remote_root / "data" / "b.bin", bytes(range(256)) * 40)
        items = [
            TransferItem("i-a", harness.remote("data/a.txt"), str(harness.site_root / "a.txt")),
            TransferItem(
                "i-b", harness.remote("data/b.bin"), str(harness.site_root / "in" / "b.bin")
            ),
        ]
        task_id = harness.backend.submit(harness.batch("in", items))
        assert isinstance(task_id, str)
        assert task_id
        status = harness.wait_final(task_id)
        assert status.task_id == task_id
        assert set(status.items) == {"i-a", "i-b"}
        assert all(outcome.ok for outcome in status.items.values()), status
        assert (harness.site_root / "a.txt").read_bytes() == first.read_bytes()
        assert (harness.site_root / "in" / "b.bin").read_bytes() == second.read_bytes()
        if harness.reports_bytes:
            assert status.items["i-a"].bytes_transferred == 6
            assert status.items["i-b"].bytes_transferred == 256 * 40

    def test_stage_out_writes_to_the_location(self, harness: TransferHarness) -> None:
        write(harness.site_root / "result.dat", b"result")
        item = TransferItem(
            "i-out", str(harness.site_root / "result.dat"), harness.remote("results/run1.dat")
        )
        status = harness.wait_final(harness.backend.submit(harness.batch("out", [item])))
        assert status.items["i-out"].ok, status
        assert (harness.remote_root / "results" / "run1.dat").read_bytes() == b"result"

    def test_the_same_submission_key_is_one_task_and_one_copy(
        self, harness: TransferHarness
    ) -> None:
        write(harness.remote_root / "once.txt", b"original")
        destination = harness.site_root / "once.txt"
        item = TransferItem("i-once", harness.remote("once.txt"), str(destination))
        batch = harness.batch("in", [item])
        task_id = harness.backend.submit(batch)
        assert harness.wait_final(task_id).items["i-once"].ok
        # Were it copied again, the file would be back to what the source holds.
        destination.write_bytes(b"changed by the job")
        assert harness.backend.submit(batch) == task_id
        assert harness.wait_final(task_id).items["i-once"].ok
        assert harness.restart().submit(batch) == task_id
        assert harness.wait_final(task_id).items["i-once"].ok
        assert destination.read_bytes() == b"changed by the job"

    def test_a_missing_source_fails_for_good_and_the_rest_of_the_batch_moves(
        self, harness: TransferHarness
    ) -> None:
        write(harness.remote_root / "present.txt", b"here")
        items = [
            TransferItem("i-gone", harness.remote("absent.txt"), str(harness.site_root / "x")),
            TransferItem(
                "i-here", harness.remote("present.txt"), str(harness.site_root / "present.txt")
            ),
        ]
        status = harness.wait_final(harness.backend.submit(harness.batch("in", items)))
        gone = status.items["i-gone"]
        assert not gone.ok
        assert gone.permanent
        assert harness.missing_words in gone.reason
        assert status.items["i-here"].ok
        assert (harness.site_root / "present.txt").read_bytes() == b"here"
        assert not (harness.site_root / "x").exists()

    @pytest.mark.parametrize(
        "bad", ["p/typo.txt", "/../../etc/passwd", "/a/../../b", "/new\nline", ""]
    )
    @pytest.mark.parametrize("direction", ["in", "out"])
    def test_a_refused_path_is_refused_alone_and_the_rest_of_the_batch_moves(
        self, harness: TransferHarness, bad: str, direction: Direction
    ) -> None:
        write(harness.remote_root / "good.txt", b"remote")
        write(harness.site_root / "good.txt", b"site")

        def item(item_id: str, remote: str) -> TransferItem:
            site = str(harness.site_root / ("in.txt" if direction == "in" else "good.txt"))
            return TransferItem(item_id, *((remote, site) if direction == "in" else (site, remote)))

        good, refused = item("i-good", harness.remote("good.txt")), item("i-bad", bad)
        whole = harness.batch(direction, [good, refused])
        harness.backend.check_item(whole, good)
        with pytest.raises(TransferRefused) as caught:
            harness.backend.check_item(whole, refused)
        assert repr(bad) in str(caught.value)
        with pytest.raises(TransferRefused):  # a batch holding it is refused as a whole
            harness.backend.submit(whole)
        status = harness.wait_final(harness.backend.submit(harness.batch(direction, [good])))
        assert status.items["i-good"].ok, status
        if direction == "in":
            assert (harness.site_root / "in.txt").read_bytes() == b"remote"
        else:
            assert (harness.remote_root / "good.txt").read_bytes() == b"site"

    def test_a_recursive_item_moves_a_tree(self, harness: TransferHarness) -> None:
        tree = harness.remote_root / "tree"
        write(tree / "top.txt", b"top")
        write(tree / "sub" / "deeper" / "leaf.txt", b"leaf!")
        (tree / "empty").mkdir()
        destination = harness.site_root / "copy-of-tree"
        item = TransferItem("i-tree", harness.remote("tree"), str(destination), recursive=True)
        status = harness.wait_final(harness.backend.submit(harness.batch("in", [item])))
        assert status.items["i-tree"].ok, status
        assert (destination / "top.txt").read_bytes() == b"top"
        assert (destination / "sub" / "deeper" / "leaf.txt").read_bytes() == b"leaf!"
        assert (destination / "empty").is_dir()
        assert sorted(p.name for p in destination.iterdir()) == ["empty", "sub", "top.txt"]
        if harness.reports_bytes:
            assert status.items["i-tree"].bytes_transferred == 3 + 5

    def test_a_directory_without_recursive_fails_for_good(self, harness: TransferHarness) -> None:
        write(harness.remote_root / "adir" / "f.txt", b"f")
        item = TransferItem("i-dir", harness.remote("adir"), str(harness.site_root / "adir"))
        status = harness.wait_final(harness.backend.submit(harness.batch("in", [item])))
        outcome = status.items["i-dir"]
        assert not outcome.ok
        assert outcome.permanent
        assert "recursive" in outcome.reason
        assert not (harness.site_root / "adir" / "f.txt").exists()

    def test_an_unknown_task_id_raises(self, harness: TransferHarness) -> None:
        for task_id in ("never-issued-1", "../escape", ""):
            with pytest.raises(UnknownTask):
                harness.backend.poll(task_id)

    def test_a_restarted_backend_still_answers_for_a_finished_task(
        self, harness: TransferHarness
    ) -> None:
        write(harness.remote_root / "r.txt", b"restart")
        items = [
            TransferItem("i-r", harness.remote("r.txt"), str(harness.site_root / "r.txt")),
            TransferItem("i-nope", harness.remote("nope.txt"), str(harness.site_root / "n")),
        ]
        task_id = harness.backend.submit(harness.batch("in", items))
        before = harness.wait_final(task_id)
        harness.close_backend(harness.backend)
        after = harness.restart().poll(task_id)
        assert after.final
        assert after.items == before.items

    def test_a_backend_restarted_mid_task_brings_it_to_an_end(
        self, harness: TransferHarness
    ) -> None:
        items = []
        for n in range(5):
            write(harness.remote_root / "many" / f"{n}.bin", bytes([n]) * 50_000)
            items.append(
                TransferItem(
                    f"i-{n}", harness.remote(f"many/{n}.bin"), str(harness.site_root / f"{n}.bin")
                )
            )
        task_id = harness.backend.submit(harness.batch("in", items))
        # Whichever object moves the items, the task ends once, with every item moved.
        status = harness.wait_final(task_id, harness.restart())
        assert all(status.items[f"i-{n}"].ok for n in range(5)), status
        for n in range(5):
            assert (harness.site_root / f"{n}.bin").read_bytes() == bytes([n]) * 50_000

    def test_cancel_is_idempotent_and_harmless_on_an_ended_task(
        self, harness: TransferHarness
    ) -> None:
        write(harness.remote_root / "c.txt", b"c")
        item = TransferItem("i-c", harness.remote("c.txt"), str(harness.site_root / "c.txt"))
        task_id = harness.backend.submit(harness.batch("in", [item]))
        before = harness.wait_final(task_id)
        harness.backend.cancel(task_id)
        harness.backend.cancel(task_id)
        harness.backend.cancel("never-issued-2")
        after = harness.backend.poll(task_id)
        assert after.final
        assert after.items == before.items

    # --- overwrite and integrity: the same outcome on every backend (base.py) -----------

    @pytest.mark.parametrize("direction", ["in", "out"])
    def test_overwrite_always_replaces_and_never_keeps_what_differs(
        self, harness: TransferHarness, direction: Direction
    ) -> None:
        move = Mover(harness, direction)
        write(move.source, b"new result\n")
        write(move.destination, b"another job's\n")
        refused = move("never")
        assert not refused.ok
        assert refused.permanent
        assert "overwrite: never" in refused.reason
        assert move.destination.read_bytes() == b"another job's\n"
        assert move("always").ok
        assert move.destination.read_bytes() == b"new result\n"
        # The same bytes are there now: a retry, or the same input staged again, succeeds.
        assert move("never").ok
        assert move.destination.read_bytes() == b"new result\n"

    @pytest.mark.parametrize("direction", ["in", "out"])
    def test_if_newer_replaces_only_an_older_destination(
        self, harness: TransferHarness, direction: Direction
    ) -> None:
        move = Mover(harness, direction)
        write(move.source, b"source")
        write(move.destination, b"newer destination")
        os.utime(move.source, (1_000_000_000, 1_000_000_000))
        assert move("if-newer").ok
        assert move.destination.read_bytes() == b"newer destination"
        os.utime(move.destination, (900_000_000, 900_000_000))
        assert move("if-newer").ok
        assert move.destination.read_bytes() == b"source"

    @pytest.mark.parametrize("policy", ["never", "always", "if-newer"])
    @pytest.mark.parametrize("direction", ["in", "out"])
    def test_a_file_bound_for_a_directory_fails_and_is_not_nested(
        self, harness: TransferHarness, direction: Direction, policy: Overwrite
    ) -> None:
        move = Mover(harness, direction)
        write(move.source, b"file")
        move.destination.mkdir(parents=True)
        outcome = move(policy)
        assert not outcome.ok
        assert outcome.permanent
        assert "Is a directory" in outcome.reason
        assert list(move.destination.iterdir()) == []

    @pytest.mark.parametrize("direction", ["in", "out"])
    def test_an_expected_digest_passes_or_fails_naming_both(
        self, harness: TransferHarness, direction: Direction
    ) -> None:
        move = Mover(harness, direction)
        write(move.source, b"payload")
        right = hashlib.sha256(b"payload").hexdigest()
        wrong = hashlib.sha256(b"something else").hexdigest()
        failed = move("always", sha256=wrong)
        assert not failed.ok
        assert failed.permanent
        assert right in failed.reason
        assert wrong in failed.reason
        if direction == "in":  # the job never finds a file that is not the one it expects
            assert not move.destination.exists()
        assert move("always", sha256=right, verify=True).ok
        assert move.destination.read_bytes() == b"payload"


class Mover:
    """Moves one file item between ``pol/f.txt`` on either side, as this machine sees them."""

    def __init__(self, harness: TransferHarness, direction: Direction) -> None:
        self.harness = harness
        self.direction = direction
        remote, site = harness.remote_root / "pol" / "f.txt", harness.site_root / "pol" / "f.txt"
        self.source, self.destination = (remote, site) if direction == "in" else (site, remote)

    def __call__(
        self, overwrite: Overwrite, *, sha256: str | None = None, verify: bool = False
    ) -> ItemOutcome:
        remote, site = self.harness.remote("pol/f.txt"), str(self.harness.site_root / "pol/f.txt")
        ends = (remote, site) if self.direction == "in" else (site, remote)
        item = TransferItem("i-p", *ends, overwrite=overwrite, verify=verify, sha256=sha256)
        batch = self.harness.batch(self.direction, [item])
        return self.harness.wait_final(self.harness.backend.submit(batch)).items["i-p"]


__all__ = ["Mover", "TransferContract", "TransferHarness", "close_if_closable", "write"]
