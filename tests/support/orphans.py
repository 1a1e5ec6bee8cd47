"""What becomes of a split replay's processes when their parent is killed outright (SIGKILL:
no ``finally`` runs in it). Linux only: run as a script.

    python -m tests.support.orphans

This process makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``), so the replay
processes, orphaned, become its children and their exit statuses can be read. It starts a
parent that starts two shares (which wait for the chunks of their share that it never
sends), kills that parent as soon as they are started, and
prints ``{pid: exit status}`` of each share as one JSON line.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
from typing import Final

from lodestream.client.analytics.parallel.pool import Shares
from lodestream.client.analytics.parallel.worker import ShareTask
from lodestream.client.analytics.selection import Selection

PR_SET_CHILD_SUBREAPER: Final = 36
PARENT_LIFETIME_S: Final = 120.0  # killed long before; a bound in case it is not


def parent() -> None:
    """Start two shares, print their pids, and wait to be killed."""
    tasks = [ShareTask(Selection(), 10, share, 2) for share in (0, 1)]
    shares = Shares(tasks)
    shares.start()
    print(json.dumps([process.pid for process in shares.processes]), flush=True)
    time.sleep(PARENT_LIFETIME_S)


def main() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    command = [sys.executable, "-m", "tests.support.orphans", "--parent"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as started:
        assert started.stdout is not None
        pids: list[int] = json.loads(started.stdout.readline())
        started.kill()
    statuses = {pid: os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids}
    print(json.dumps(statuses), flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--parent"]:
        parent()
    else:
        main()
