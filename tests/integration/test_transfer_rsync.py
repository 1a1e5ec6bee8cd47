"""What the rsync backend adds to the shared suite: a missing tool, copies stopped half way
(rsync killed, the site agent killed, a cancel, a close) and how ssh failures read."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import pytest

from lodestream.platform_adapters.transfers.base import (
    TransferItem,
    TransferRefused,
    TransferUnavailable,
)
from lodestream.platform_adapters.transfers.rsync import PARTIAL_DIR, RsyncBackend
from lodestream.platform_adapters.transfers.task_store import batch_to_json
from tests.fixtures.sshd import SshServer, require_rsync
from tests.support.transfer_contract import TransferHarness, write

REPO: Final = Path(__file__).parents[2]
BIG: Final = 1024 * 1024
# Slow enough (KiB/s) that a test stops the copy well before its end.
SLOW: Final = ("--bwlimit=128",)
WAIT_S: Final = 30.0


@contextmanager
def rsync_harness(tmp_path: Path, **options: Any) -> Iterator[TransferHarness]:
    require_rsync()
    url = options.pop("url", f"rsync:{tmp_path / 'remote'}")
    harness = TransferHarness(
        url=url,
        remote_root=tmp_path / "remote",
        site_root=tmp_path / "site",
        make_backend=lambda: RsyncBackend(url, state_dir=tmp_path / "state", **options),
    )
    try:
        yield harness
    finally:
        harness.close()


def wait_until(what: str, probe: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not probe():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {WAIT_S} s waiting for {what}")
        time.sleep(0.02)


def proc_stat(pid: int) -> tuple[str, str, int, int] | None:
    """(comm, state, ppid, pgid) of a live process, None once it is gone."""
    try:
        text = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return None
    comm = text[text.index("(") + 1 : text.rindex(")")]
    state, ppid, pgid = text[text.rindex(")") + 2 :].split()[:3]
    return comm, state, int(ppid), int(pgid)


def live_rsyncs(*, parent: int | None = None, group: int | None = None) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or (stat := proc_stat(int(entry.name))) is None:
            continue
        comm, state, ppid, pgid = stat
        if comm == "rsync" and state != "Z" and parent in {None, ppid} and group in {None, pgid}:
            found.append(int(entry.name))
    return found


def half_written(directory: Path, name: str) -> bool:
    """rsync is writing ``name``: its temporary file holds some bytes, not yet all."""
    temporaries = list(directory.glob(f".{name}.*")) if directory.is_dir() else []
    return any(0 < path.stat().st_size < BIG for path in temporaries)


def test_a_missing_rsync_is_unavailable_and_nothing_is_recorded(tmp_path: Path) -> None:
    with rsync_harness(tmp_path, rsync="lode-no-such-rsync") as harness:
        item = TransferItem("i", "/a", str(tmp_path / "site" / "a"))
        with pytest.raises(TransferUnavailable, match="install rsync"):
            harness.backend.submit(harness.batch("in", [item], key="nothing-1"))
    assert not (tmp_path / "state" / "rsync" / "nothing-1").exists()


def test_a_missing_ssh_identity_is_unavailable(tmp_path: Path) -> None:
    url = f"rsync://root@127.0.0.1:1{tmp_path / 'remote'}"
    with rsync_harness(tmp_path, url=url, identity_file=tmp_path / "no-key") as harness:
        item = TransferItem("i", "/a", str(tmp_path / "site" / "a"))
        with pytest.raises(TransferUnavailable, match="ssh identity"):
            harness.backend.submit(harness.batch("in", [item]))


def test_paths_outside_the_base_are_refused(tmp_path: Path) -> None:
    with rsync_harness(tmp_path) as harness:
        item = TransferItem("i", "/../../etc/shadow", str(tmp_path / "site" / "s"))
        with pytest.raises(TransferRefused, match="climbs out"):
            harness.backend.submit(harness.batch("in", [item]))


def test_a_killed_rsync_fails_the_item_for_now_and_the_retry_finishes_the_file(
    tmp_path: Path,
) -> None:
    with rsync_harness(tmp_path, rsync_options=SLOW) as slow:
        data = os.urandom(BIG)
        write(slow.remote_root / "big.bin", data)
        destination = slow.site_root / "big.bin"
        item = TransferItem("i-big", "/big.bin", str(destination))
        task_id = slow.backend.submit(slow.batch("in", [item], key="killed-1"))
        wait_until("rsync to be half way", lambda: half_written(slow.site_root, "big.bin"))
        (rsync,) = live_rsyncs(parent=os.getpid())
        os.kill(rsync, signal.SIGKILL)
        outcome = slow.wait_final(task_id).items["i-big"]
        assert (outcome.ok, outcome.permanent) == (False, False)
        assert outcome.reason == "rsync was killed by signal 9"
        assert not destination.exists()  # never a half file under the final name
    # The module retries the item as a new submission; rsync resumes from its partial file.
    with rsync_harness(tmp_path) as fast:
        status = fast.wait_final(fast.backend.submit(fast.batch("in", [item], key="killed-2")))
    assert status.items["i-big"].ok
    assert destination.read_bytes() == data
    assert [p.name for p in fast.site_root.iterdir()] == ["big.bin"]


_AGENT = """
import json, sys, time
from pathlib import Path
from lodestream.platform_adapters.transfers.rsync import RsyncBackend
from lodestream.platform_adapters.transfers.task_store import batch_from_json

url, state_dir, batch, option = sys.argv[1:]
backend = RsyncBackend(url, state_dir=Path(state_dir), rsync_options=[option])
print(backend.submit(batch_from_json(json.loads(batch))), flush=True)
time.sleep(600)
"""


def test_a_copy_cut_short_by_the_site_agent_dying_is_finished_by_the_next_agent(
    tmp_path: Path,
) -> None:
    with rsync_harness(tmp_path) as harness:
        data = os.urandom(BIG)
        write(harness.remote_root / "big.bin", data)
        destination = harness.site_root / "big.bin"
        batch = harness.batch(
            "in", [TransferItem("i-big", "/big.bin", str(destination))], key="agent-1"
        )
        argv = [sys.executable, "-c", _AGENT, harness.url, str(tmp_path / "state")]
        agent = subprocess.Popen(
            [*argv, json.dumps(batch_to_json(batch)), SLOW[0]],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            start_new_session=True,
        )
        try:
            assert agent.stdout is not None
            assert agent.stdout.readline().strip() == "agent-1"
            wait_until("rsync to be half way", lambda: half_written(harness.site_root, "big.bin"))
            # The agent dies; then its service manager stops what is left (SIGTERM).
            agent.kill()
            agent.wait()
            os.killpg(agent.pid, signal.SIGTERM)
            wait_until("rsync to stop", lambda: not live_rsyncs(group=agent.pid))
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
            agent.stdout.close()  # type: ignore[union-attr]
        assert not destination.exists()
        assert (harness.site_root / PARTIAL_DIR / "big.bin").exists()  # what rsync kept
        assert not harness.backend.poll("agent-1").final
        status = harness.wait_final("agent-1")
    assert status.items["i-big"].ok, status
    assert status.items["i-big"].bytes_transferred == BIG
    assert destination.read_bytes() == data
    assert [p.name for p in harness.site_root.iterdir()] == ["big.bin"]


def test_cancel_stops_a_running_copy_and_the_items_after_it(tmp_path: Path) -> None:
    with rsync_harness(tmp_path, rsync_options=SLOW) as harness:
        write(harness.remote_root / "big.bin", os.urandom(BIG))
        items = [
            TransferItem("i-big", "/big.bin", str(harness.site_root / "big.bin")),
            TransferItem("i-next", "/big.bin", str(harness.site_root / "next.bin")),
        ]
        task_id = harness.backend.submit(harness.batch("in", items))
        wait_until("rsync to be half way", lambda: half_written(harness.site_root, "big.bin"))
        harness.backend.cancel(task_id)
        status = harness.wait_final(task_id)
    assert status.items["i-big"].reason.startswith("cancelled while rsync ran")
    assert status.items["i-next"].reason == "cancelled before it was moved"
    assert not any(outcome.ok or outcome.permanent for outcome in status.items.values())
    assert not (harness.site_root / "big.bin").exists()


def test_a_closed_backend_leaves_its_task_to_the_next_one(tmp_path: Path) -> None:
    with rsync_harness(tmp_path, rsync_options=SLOW) as slow:
        data = os.urandom(BIG)
        write(slow.remote_root / "big.bin", data)
        item = TransferItem("i-big", "/big.bin", str(slow.site_root / "big.bin"))
        task_id = slow.backend.submit(slow.batch("in", [item], key="closed-1"))
        wait_until("rsync to be half way", lambda: half_written(slow.site_root, "big.bin"))
        slow.close()
        assert not slow.backend.poll(task_id).final
    with rsync_harness(tmp_path) as fast:
        assert fast.wait_final(task_id).items["i-big"].ok
    assert (fast.site_root / "big.bin").read_bytes() == data


def test_over_ssh_a_refused_key_is_retried_in_ssh_s_words(
    tmp_path: Path, sshd_server: SshServer
) -> None:
    stranger = tmp_path / "stranger_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)],
        check=True,
        capture_output=True,
    )
    server = sshd_server
    url = f"rsync://{server.user}@{server.host}:{server.port}{tmp_path / 'remote'}"
    with rsync_harness(
        tmp_path, url=url, identity_file=stranger, ssh_options=server.ssh_options
    ) as harness:
        write(harness.remote_root / "a.txt", b"a")
        item = TransferItem("i-a", "/a.txt", str(harness.site_root / "a.txt"))
        outcome = harness.wait_final(harness.backend.submit(harness.batch("in", [item])))
    refused = outcome.items["i-a"]
    assert (refused.ok, refused.permanent) == (False, False)
    assert "Permission denied (publickey)" in refused.reason


def test_over_ssh_a_closed_port_is_retried(tmp_path: Path) -> None:
    if shutil.which("ssh") is None:
        pytest.skip("ssh is not installed: run `make xfer-deps` as root")
    with rsync_harness(tmp_path, url=f"rsync://root@127.0.0.1:1{tmp_path / 'remote'}") as harness:
        item = TransferItem("i-a", "/a.txt", str(harness.site_root / "a.txt"))
        outcome = harness.wait_final(harness.backend.submit(harness.batch("in", [item])))
    closed = outcome.items["i-a"]
    assert (closed.ok, closed.permanent) == (False, False)
    assert "Connection refused" in closed.reason
