"""The one way compute code asks a scheduler something: run a command, get its stdout.

Discovery and wall-time functions take a ``CommandRunner`` so that tests hand them captured
output instead of a scheduler.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from typing import Final

from lodestream.platform_adapters.errors import SchedulerQueryFailed

CommandRunner = Callable[[Sequence[str]], str]

COMMAND_TIMEOUT_S: Final = 30.0
_STDERR_TAIL = 500


def run_command(argv: Sequence[str], timeout_s: float = COMMAND_TIMEOUT_S) -> str:
    """The stdout of ``argv``; ``SchedulerQueryFailed`` if it cannot run, fails or hangs."""
    try:
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError as exc:
        raise SchedulerQueryFailed(f"{argv[0]}: not found on PATH") from exc
    except subprocess.TimeoutExpired as exc:
        raise SchedulerQueryFailed(f"{' '.join(argv)}: no answer in {timeout_s:g}s") from exc
    except OSError as exc:
        raise SchedulerQueryFailed(f"{argv[0]}: cannot run: {exc}") from exc
    if done.returncode != 0:
        tail = done.stderr.strip()[-_STDERR_TAIL:]
        raise SchedulerQueryFailed(f"{' '.join(argv)} exited with {done.returncode}: {tail}")
    return done.stdout
