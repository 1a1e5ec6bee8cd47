"""A warm worker: runs the pilot's Python-function jobs one after another in one process.

Each job frame says where and how: ``{"job_id", "app", "params_json", "workdir", "env",
"stdout", "stderr"}``. The job runs as pyrun would run it in a fresh interpreter
(:func:`~lodestream.agents.site.apps.pyrun.run_loaded`: the same params and result files),
in its workdir, with ``env`` as its whole environment and its stdout/stderr on its files;
the worker's cwd, environment and descriptors are put back after, whatever the job did.
The answer is ``{"code": exit_status, "rss_kb": rss_now, "recycle": bool}``; ``recycle``
says the worker should not be given another job (it ran out of memory).
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lodestream.agents.launcher.warm import frames
from lodestream.agents.site.apps.pyrun import run_loaded
from lodestream.agents.site.apps.render import PYRUN_PARAMS, PYRUN_RESULT

_OUTPUT_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True, slots=True)
class Limits:
    memory_limit_mb: float | None = None


def serve(sock: socket.socket, apps: dict[str, Any], limits: Limits) -> int:
    """Run jobs until the pilot closes the socket; the worker's exit status."""
    if limits.memory_limit_mb is not None:
        cap = int(limits.memory_limit_mb * 1024 * 1024)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    home = str(Path.cwd())
    environ = dict(os.environ)
    saved = (os.dup(1), os.dup(2))
    while True:
        job = frames.recv(sock)
        if job is None:
            return 0
        code, recycle = run_job(job, apps, home, environ, saved)
        frames.send(sock, {"code": code, "rss_kb": rss_kb(), "recycle": recycle})


def run_job(
    job: dict[str, Any],
    apps: dict[str, Any],
    home: str,
    environ: dict[str, str],
    saved: tuple[int, int],
) -> tuple[int, bool]:
    """Run one job; its exit status, and whether the worker must be recycled after it."""
    workdir = Path(job["workdir"])
    recycle = False
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        _redirect(job["stdout"], job["stderr"])
        os.chdir(workdir)
        _use_env(job["env"], environ)
        params = workdir / PYRUN_PARAMS
        params.parent.mkdir(exist_ok=True)
        params.write_text(job["params_json"] + "\n", encoding="utf-8")
        code = run_loaded(apps, job["app"], params, workdir / PYRUN_RESULT)
    except MemoryError:  # the job ran out: the worker may be half-broken, let it go
        code, recycle = 1, True
    except OSError as exc:  # its workdir or output files: the job fails as a start would
        with contextlib.suppress(OSError):
            os.write(2, f"lodestream worker: {exc}\n".encode())
        code = 1
    finally:
        _restore(home, environ, saved)
    return code, recycle or (code != 0 and _ran_out(workdir))


def rss_kb() -> int:
    try:
        with Path("/proc/self/statm").open("rb") as f:
            return int(f.read().split()[1]) * _PAGE // 1024
    except (OSError, ValueError, IndexError):
        return 0


def _redirect(stdout: str, stderr: str) -> None:
    out = os.open(stdout, _OUTPUT_FLAGS, 0o666)
    err = out if stderr == stdout else os.open(stderr, _OUTPUT_FLAGS, 0o666)
    try:
        os.dup2(out, 1)
        os.dup2(err, 2)
    finally:
        os.close(out)
        if err != out:
            os.close(err)


def _restore(home: str, environ: dict[str, str], saved: tuple[int, int]) -> None:
    # The job may have replaced or closed sys.stdout/stderr: the next job gets them back.
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
    os.dup2(saved[0], 1)
    os.dup2(saved[1], 2)
    os.chdir(home)
    _use_env(environ, os.environ.copy())


def _use_env(target: dict[str, str], now: Mapping[str, str]) -> None:
    """Make ``os.environ`` be ``target``, knowing it is ``now``: only what differs changes.

    Clearing and refilling it cost most of a no-op job (every key is encoded, set and
    unset, and ``clear`` restarts its iteration at each key).
    """
    for key in now.keys() - target.keys():
        del os.environ[key]
    for key, value in target.items():
        if now.get(key) != value:
            os.environ[key] = value


def _ran_out(workdir: Path) -> bool:
    """Whether pyrun reported a MemoryError: caught there, but the worker should go."""
    try:
        with (workdir / PYRUN_RESULT).open("rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return b'"error": "MemoryError' in head
