"""Runs one job of the local scheduler, detached from whoever submitted it.

``LocalScheduler`` starts this file as ``python -I local_wrapper.py JOB_DIR WALL_S GRACE_S
SCRIPT STDOUT STDERR``. It uses the standard library only and is run as a file, so starting it
imports nothing of lodestream. It forks: the parent waits until the child can take SIGTERM,
writes the child's pid, and exits, so the submitter's wait is short and leaves no zombie, and a
``delete`` right after ``submit`` always finds a pid to signal. The child, in a session of its
own, runs the script with bash in another new session, and ends it at its wall time or on
SIGTERM: SIGTERM to the script's process group, SIGKILL after the grace period. Whatever the
script left running is killed when it exits, as a batch allocation's end would.

Files in JOB_DIR, each written whole (temporary name, then rename):

* ``wrapper.pid`` the child's pid;
* ``started`` when the script was started (seconds since the epoch);
* ``result.json`` ``{"reason": "exited"|"walltime"|"cancelled"|"error", "returncode": int|null,
  "ended": float, "error": str}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 0.1


def write_whole(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def run_job(
    *,
    job_dir: Path,
    wall_s: float,
    grace_s: float,
    script: Path,
    out: Path,
    err: Path,
    flags: list[bool],
) -> dict[str, object]:
    """Run the script to its end; ``flags`` gets an item when SIGTERM (a delete) arrives."""
    if flags:
        return {"reason": "cancelled", "returncode": None}
    try:
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = subprocess.Popen(
                ["/bin/bash", str(script)],
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                cwd=script.parent,
                start_new_session=True,
            )
    except OSError as exc:
        return {"reason": "error", "returncode": None, "error": str(exc)}
    write_whole(job_dir / "started", f"{time.time()!r}\n")
    deadline = time.monotonic() + wall_s
    reason, kill_at = "exited", None
    while (returncode := proc.poll()) is None:
        now = time.monotonic()
        if reason == "exited" and (flags or now >= deadline):
            reason = "cancelled" if flags else "walltime"
            _signal_group(proc.pid, signal.SIGTERM)
            kill_at = now + grace_s
        elif kill_at is not None and now >= kill_at:
            _signal_group(proc.pid, signal.SIGKILL)
            kill_at = None
        time.sleep(POLL_S)
    _signal_group(proc.pid, signal.SIGKILL)  # what the script left behind
    return {"reason": reason, "returncode": returncode}


def main(argv: list[str]) -> int:
    job_dir, wall_s, grace_s, script, out, err = argv
    ready_read, ready_write = os.pipe()
    child = os.fork()
    if child:
        os.close(ready_write)
        os.read(ready_read, 1)
        write_whole(Path(job_dir) / "wrapper.pid", f"{child}\n")
        return 0
    os.close(ready_read)
    os.setsid()
    flags: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: flags.append(True))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    os.write(ready_write, b".")
    os.close(ready_write)
    try:
        result = run_job(
            job_dir=Path(job_dir),
            wall_s=float(wall_s),
            grace_s=float(grace_s),
            script=Path(script),
            out=Path(out),
            err=Path(err),
            flags=flags,
        )
    except Exception as exc:  # recorded as the job's end rather than lost with the process
        result = {"reason": "error", "returncode": None, "error": repr(exc)}
    result["ended"] = time.time()
    write_whole(Path(job_dir) / "result.json", json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    os._exit(main(sys.argv[1:]))
