"""The template of a pilot's warm Python workers (``python -m`` this module).

Started once per pilot (and again when the site's apps change), it imports the site's apps and
then only forks: each fork request carries the new worker's socket, and the child serves jobs
on it (:mod:`.worker`) with everything already imported. The template is the workers' parent,
so it reaps them and reports each exit status with the worker's peak RSS (``wait4``).

Requests (pilot → template): ``{"op": "fork", "gpus": "0,1" | ""}`` with the worker's socket.
Answers and notices (template → pilot): ``{"ready": true}`` or ``{"error": "..."}`` once,
``{"forked": pid}`` per request, ``{"exited": pid, "code": c, "maxrss_kb": k}`` per reaped
worker (``code`` as ``subprocess`` gives it: ``-signum`` if signalled). End of stream from
the pilot: the template kills its workers and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from lodestream.agents.launcher.warm import frames
from lodestream.agents.launcher.warm.worker import Limits, serve
from lodestream.agents.site.apps import load_apps
from lodestream.agents.site.apps import pyrun as _pyrun  # noqa: F401 - warmed for the workers

CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _serve_pilot(args)
    except (BrokenPipeError, ConnectionResetError):
        # The pilot went away (SIGKILLed, say) while we told it something: nobody is left to
        # tell, and the workers went with _serve_pilot's cleanup.
        return 0


def _serve_pilot(args: argparse.Namespace) -> int:
    ctl = socket.socket(fileno=args.fd)
    try:
        apps = load_apps(Path(args.apps_dir))
    except Exception as exc:  # site code: anything may fail; the pilot says why
        frames.send(ctl, {"error": f"{type(exc).__name__}: {exc}"})
        return 2
    limits = Limits(memory_limit_mb=args.memory_limit_mb)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    frames.send(ctl, {"ready": True})
    children: set[int] = set()
    try:
        while True:
            readable, _, _ = select.select([ctl.fileno(), wake_r], [], [])
            if wake_r in readable:
                os.read(wake_r, 4096)
                try:
                    _reap(ctl, children)
                except OSError:  # the pilot is gone (a broken pipe): nobody to tell
                    return 0
            if ctl.fileno() in readable:
                try:
                    request = frames.recv_with_fd(ctl)
                except (OSError, frames.FrameError):
                    request = None  # the pilot is gone
                if request is None:
                    return 0
                doc, fd = request
                if doc.get("op") != "fork" or fd is None:
                    frames.send(ctl, {"error": f"unknown request {doc!r}"})
                    continue
                pid = os.fork()
                if pid == 0:  # the worker: never returns
                    os.close(wake_r)
                    os.close(wake_w)
                    _become_worker(ctl, fd, str(doc.get("gpus", "")), apps, limits)
                os.close(fd)
                children.add(pid)
                frames.send(ctl, {"forked": pid})
    finally:
        for pid in children:  # the pilot is gone: so is every job it ran here
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def _become_worker(
    ctl: socket.socket, fd: int, gpus: str, apps: dict[str, type], limits: Limits
) -> None:
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    ctl.close()
    if gpus:
        os.environ[CUDA_VISIBLE_DEVICES] = gpus
        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    code = 1
    try:
        os.setsid()  # its own group: a kill reaches what the job started too
        code = serve(socket.socket(fileno=fd), apps, limits)
    finally:
        os._exit(code)


def _reap(ctl: socket.socket, children: set[int]) -> None:
    while children:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        frames.send(ctl, {"exited": pid, "code": os.waitstatus_to_exitcode(status),
                          "maxrss_kb": usage.ru_maxrss})  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lodestream.agents.launcher.warm.template")
    parser.add_argument("--apps-dir", required=True)
    parser.add_argument("--fd", type=int, required=True, help="the pilot's control socket")
    parser.add_argument("--memory-limit-mb", type=float, default=None)
    return parser


if __name__ == "__main__":
    sys.exit(main())
