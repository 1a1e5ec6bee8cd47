"""Running one scheduler command: the only place the command-line adapters touch a process.

Adapters take a ``CommandRunner``; ``run_command`` is the real one, and tests pass one that
answers with captured outputs. Failures are mapped here, once: a missing or unexecutable
command is ``SchedulerUnavailable`` naming it, a hang is ``SchedulerTimeout``. A non-zero exit
is returned, not raised, because several commands exit non-zero with an answer (``qstat`` with
one unknown id among known ones); ``require_success`` is for the callers that want it raised.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from lodestream.platform_adapters.errors import (
    SchedulerCommandFailed,
    SchedulerTimeout,
    SchedulerUnavailable,
)

DEFAULT_TIMEOUT_S = 60.0
_MAX_MESSAGE = 2000  # a scheduler's complaint, not its whole output


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What one command printed and how it exited; the input of every ``parse_*`` function."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class CommandRunner(Protocol):
    def __call__(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> CommandResult:
        """Run ``argv`` (``env`` added to this process's environment) and return its result."""
        ...


def run_command(
    argv: Sequence[str],
    *,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> CommandResult:
    """Run one scheduler command without a shell, with stdin closed, for at most ``timeout_s``."""
    words = tuple(argv)
    full_env = None if not env else {**os.environ, **env}
    try:
        done = subprocess.run(
            words,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            env=full_env,
            cwd=cwd,
            check=False,
        )
    except FileNotFoundError as exc:
        if cwd is not None and not cwd.is_dir():
            raise SchedulerUnavailable(f"cannot run {words[0]}: no directory {cwd}") from exc
        raise SchedulerUnavailable(
            f"scheduler command {words[0]!r} not found (is this a login node of that scheduler,"
            " and is it on PATH?)"
        ) from exc
    except PermissionError as exc:
        raise SchedulerUnavailable(f"scheduler command {words[0]!r} is not executable") from exc
    except subprocess.TimeoutExpired as exc:
        raise SchedulerTimeout(
            f"{' '.join(words)} did not finish within {timeout_s:g} s (scheduler not responding?)"
        ) from exc
    return CommandResult(
        argv=words,
        returncode=done.returncode,
        stdout=done.stdout.decode("utf-8", errors="replace"),
        stderr=done.stderr.decode("utf-8", errors="replace"),
    )


def failure_message(result: CommandResult) -> str:
    """``<command> exited <rc>: <what it said>``, stderr first since that is where errors go."""
    said = (result.stderr.strip() or result.stdout.strip())[-_MAX_MESSAGE:]
    return f"{result.argv[0]} exited {result.returncode}: {said or '(no output)'}"


def require_success(
    result: CommandResult, error: type[SchedulerCommandFailed] = SchedulerCommandFailed
) -> CommandResult:
    """``result`` if its command exited 0, else ``error`` quoting the scheduler's own words."""
    if result.returncode != 0:
        raise error(failure_message(result), argv=result.argv, returncode=result.returncode)
    return result
