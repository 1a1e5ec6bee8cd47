"""Capture what rsync prints in the cases ``rsync_output`` reads: ``rsync/<case>.json``.

Run as root from the repository root (``PYTHONPATH=. python
tests/data/transfers/capture_rsync.py``), with rsync and openssh installed (``make
xfer-deps``). Each case runs the command line ``RsyncBackend`` renders, for real, on this
machine or over ssh to a throwaway sshd on loopback, and stores the command, exit status,
stdout and stderr. The no-space case mounts a 64 KiB tmpfs; the permission case runs rsync as
``nobody`` (root reads everything).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from lodestream.platform_adapters.transfers.paths import ItemPaths
from lodestream.platform_adapters.transfers.rsync import RsyncLocation, render_rsync_argv
from tests.fixtures.sshd import SshServer, ssh_server_at

OUT = Path(__file__).with_name("rsync")
LOCAL = RsyncLocation("rsync:", None)


def argv_for(
    source: Path | str,
    destination: Path | str,
    *,
    recursive: bool = False,
    location: RsyncLocation = LOCAL,
    remote_source: bool = True,
    ssh_argv: Sequence[str] = (),
    options: Sequence[str] = (),
) -> list[str]:
    paths = ItemPaths(str(source), str(destination), remote_source)
    return render_rsync_argv(
        "rsync", location, paths, recursive=recursive, ssh_argv=ssh_argv, rsync_options=options
    )


def record(
    case: str, argv: list[str], *, prefix: Sequence[str] = (), stop_after_s: float = 0.0
) -> None:
    proc = subprocess.Popen(
        [*prefix, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
    )
    if stop_after_s:
        time.sleep(stop_after_s)
        proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    OUT.mkdir(exist_ok=True)
    text = {"argv": argv, "returncode": proc.returncode, "stdout": stdout, "stderr": stderr}
    (OUT / f"{case}.json").write_text(json.dumps(text, indent=2) + "\n")
    print(f"{case}: exit {proc.returncode}")


def capture_local(root: Path) -> None:
    src, dst = root / "src", root / "dst"
    (src / "tree" / "sub").mkdir(parents=True)
    for directory in (root, src):
        directory.chmod(0o755)
    (src / "a.txt").write_text("hello\n")
    (src / "tree" / "one.txt").write_text("one\n")
    (src / "tree" / "sub" / "two.txt").write_text("two two\n")
    (src / "big.bin").write_bytes(bytes(range(256)) * 8192)  # 2 MiB
    record("file_copied", argv_for(src / "a.txt", dst / "in" / "a.txt"))
    record("tree_copied", argv_for(src / "tree", dst / "tree", recursive=True))
    human = [a for a in argv_for(src / "big.bin", dst / "big.bin") if a != "--no-human-readable"]
    record("human_readable_stats", human)
    record("missing_source", argv_for(src / "no-such-file", dst / "x"))
    record("directory_not_recursive", argv_for(src / "tree", dst / "flat"))
    record("recursive_on_a_file", argv_for(src / "a.txt", dst / "r", recursive=True))
    secret = src / "secret.txt"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    (dst / "nobody").mkdir(parents=True)
    shutil.chown(dst / "nobody", "nobody")
    nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    record("permission_denied", argv_for(secret, dst / "nobody" / "s.txt"), prefix=nobody)
    slow = argv_for(src / "big.bin", dst / "slow.bin", options=["--bwlimit=256"])
    record("interrupted", slow, stop_after_s=2.0)
    small = root / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)], check=True)
    try:
        record("no_space", argv_for(src / "big.bin", small / "big.bin"))
    finally:
        subprocess.run(["umount", str(small)], check=True)


def capture_ssh(root: Path, server: SshServer) -> None:
    src, dst = root / "src", root / "dst"
    src.mkdir(parents=True)
    (src / "a.txt").write_text("hello\n")
    url = f"rsync://{server.user}@{server.host}:{server.port}/"
    location = RsyncLocation.parse(url)

    def ssh_argv(port: int, identity: Path) -> list[str]:
        argv = ["ssh", "-p", str(port), "-i", str(identity), "-o", "IdentitiesOnly=yes"]
        return [*argv, "-o", "BatchMode=yes", *server.ssh_options]

    ssh = ssh_argv(server.port, server.identity_file)
    record(
        "ssh_file_copied", argv_for(src / "a.txt", dst / "a.txt", location=location, ssh_argv=ssh)
    )
    record(
        "ssh_missing_source",
        argv_for(src / "no-such-file", dst / "x", location=location, ssh_argv=ssh),
    )
    closed = RsyncLocation.parse("rsync://root@127.0.0.1:1/")
    closed_ssh = ssh_argv(1, server.identity_file)
    record("ssh_refused", argv_for(src / "a.txt", dst / "b", location=closed, ssh_argv=closed_ssh))
    stranger = root / "stranger_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    wrong_key = ssh_argv(server.port, stranger)
    record(
        "ssh_key_refused", argv_for(src / "a.txt", dst / "c", location=location, ssh_argv=wrong_key)
    )
    empty = root / "empty_known_hosts"
    empty.touch()
    unknown_host = [a.replace(str(server.known_hosts), str(empty)) for a in ssh]
    record(
        "ssh_unknown_host_key",
        argv_for(src / "a.txt", dst / "d", location=location, ssh_argv=unknown_host),
    )
    record(
        "ssh_no_remote_rsync",
        argv_for(
            src / "a.txt", dst / "e", location=location, ssh_argv=ssh,
            options=["--rsync-path=/nonexistent/rsync"],
        ),
    )  # fmt: skip
    record(
        "ssh_timeout",
        argv_for(
            src / "a.txt", dst / "f", location=location, ssh_argv=ssh,
            options=["--timeout=2", "--rsync-path=sleep 30; rsync"],
        ),
    )  # fmt: skip


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="lode-capture-") as tmp:
        Path(tmp).chmod(0o755)  # nobody must reach the files the permission case reads
        capture_local(Path(tmp) / "local")
        sshd_root = Path(tmp) / "sshd"
        sshd_root.mkdir()
        with ssh_server_at(sshd_root) as server:
            capture_ssh(Path(tmp) / "ssh", server)


if __name__ == "__main__":
    main()
