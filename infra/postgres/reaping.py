"""Waiting for the backends a dead postmaster leaves behind (Linux, with fallbacks).

A SIGKILLed postmaster's backends notice its death and exit by themselves; a
restart before they have would find the shared memory still attached and be
refused. :class:`lodestream.infra.postgres.server.EmbeddedPostgres` uses these to wait.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Final

_PR_SET_CHILD_SUBREAPER: Final = 36
_PR_GET_CHILD_SUBREAPER: Final = 37


def children(pid: int) -> set[int]:
    """The current children of ``pid``."""
    proc = Path("/proc")
    if not proc.is_dir():
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
        return {int(child) for child in out.stdout.split()}
    found = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[1]) == pid:
            found.add(int(entry.name))
    return found


@contextlib.contextmanager
def adopting_orphans() -> Iterator[None]:
    """Be the reaper of our descendants' orphans while the block runs (Linux only).

    Backends orphaned by a SIGKILLed postmaster are re-parented to the nearest
    subreaper, normally PID 1. Not every PID 1 reaps (minimal container
    inits do not), which would leave ``<defunct>`` postgres entries behind;
    adopting them lets :func:`reaped` collect them.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        yield
        return
    was = ctypes.c_int(0)
    prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0)
    if was.value or prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        yield
        return
    try:
        yield
    finally:
        prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def reaped(pid: int) -> bool:
    """True once ``pid`` has exited (and been reaped, if it is our child)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child: someone else reaps it
    else:
        return done == pid
    if Path("/proc").is_dir():
        # A zombie holds no shared memory, and under a PID 1 that never reaps it stays.
        try:
            status = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return True
        return status.rsplit(")", 1)[1].split()[0] == "Z"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def send_signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
