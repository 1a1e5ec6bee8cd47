"""The pilot's side of its warm Python workers: one template process, and the workers it forks.

The pool is used from the pilot's event loop only. A job is handed to an idle worker bound to
the job's GPUs (none: unbound) as one frame; the worker is the job's task
(:class:`~.task.WarmTask`) until its answer comes back, then idle again, or retired: after
``max_jobs`` jobs, above ``max_rss_mb``, after a ``MemoryError``, or when the apps it imported
are no longer the site's. A worker that dies is never reused; the next job that finds no idle
worker forks another (a fork of the warm template: milliseconds, not an interpreter start).

The site's apps are compared with what the template imported at most once a second (the
``*.py`` files of the apps directory: names, sizes, mtimes); when they changed, a new template
is started and new jobs go to its workers, while jobs running on the old one finish there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from lodestream.agents.launcher.warm import frames
from lodestream.agents.launcher.warm.task import WarmTask
from lodestream.agents.site.apps import ApplicationDefinition
from lodestream.agents.site.apps.render import PyCall
from lodestream.agents.site.settings import PythonWorkerSettings
from lodestream.platform_adapters.errors import StartFailed
from lodestream.platform_adapters.launchers.base import TaskSpec, render_env

log = logging.getLogger(__name__)

READY_TIMEOUT_S: Final = 120.0  # importing a site's apps (numpy, torch, ...) can take a while
EXIT_REPORT_S: Final = 5.0  # how long a dead worker's status may take to come from the template
APPS_CHECK_S: Final = 1.0
Fingerprint = tuple[tuple[str, int, int], ...]


class TemplateFailed(Exception):
    """The template could not start or import the site's apps."""


@dataclass(eq=False)
class Template:
    proc: subprocess.Popen[bytes]
    sock: socket.socket
    fingerprint: Fingerprint
    reader: frames.Reader = field(init=False)
    exits: dict[int, tuple[int, int]] = field(default_factory=dict)
    watching: set[int] = field(default_factory=set)  # workers whose exit the pool awaits
    stale: bool = False

    def __post_init__(self) -> None:
        self.reader = frames.Reader(self.sock)

    def drain(self) -> list[dict[str, Any]]:
        """Read what the template said; exit notices are kept, the rest returned."""
        out = []
        for doc in self.reader.frames():
            if "exited" in doc:
                if int(doc["exited"]) in self.watching:
                    self.exits[int(doc["exited"])] = (int(doc["code"]), int(doc["maxrss_kb"]))
            else:
                out.append(doc)
        return out

    def answer(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            docs = self.drain()
            if docs:
                return docs[0]
            left = deadline - time.monotonic()
            if self.reader.closed or left <= 0:
                raise TemplateFailed(f"the worker template (pid {self.proc.pid}) did not answer")
            select.select([self.sock], [], [], left)

    def close(self) -> None:
        # End of stream: the template kills its workers and exits.
        self.sock.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass(eq=False)
class Worker:
    pid: int
    sock: socket.socket
    gpus: str
    template: Template
    reader: frames.Reader = field(init=False)
    jobs: int = 0
    busy: bool = False
    gone: bool = False

    def __post_init__(self) -> None:
        self.reader = frames.Reader(self.sock)

    def signal(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:  # not yet its own group leader
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)


class WarmPool:
    """Warm Python workers for the pilot's function jobs (see the module docstring)."""

    def __init__(
        self,
        apps_dir: Path,
        settings: PythonWorkerSettings,
        *,
        env: Mapping[str, str],
        cwd: Path,
        size: int,
        python: str = sys.executable,
    ) -> None:
        self._apps_dir = apps_dir
        self._settings = settings
        self._env = dict(env)
        self._cwd = cwd
        self._size = max(size, 1)
        self._python = python
        self._template: Template | None = None
        self._old: list[Template] = []
        self._workers: list[Worker] = []
        self._checked_at = 0.0
        self._swap = asyncio.Lock()
        self._opening: asyncio.Task[None] | None = None
        self.broken: str | None = None
        self._warm_apps: dict[type[ApplicationDefinition], bool] = {}
        self.forks = 0  # workers started in all: the first `size`, then replacements

    # --- lifecycle ------------------------------------------------------------------------

    def ensure_open(self) -> asyncio.Task[None]:
        """Open the pool once (:meth:`open`), in the background: at the pilot's start when
        one of the site's apps runs warm, else at its first function job (an app added
        later), so a site without function apps starts no template and no worker."""
        if self._opening is None:
            self._opening = asyncio.create_task(self._open())
        return self._opening

    async def opened(self) -> None:
        """Wait for an open this pilot started, if any (it stops)."""
        if self._opening is not None:
            await self._opening

    async def open(self) -> None:
        """Open the pool now (once, however often asked) and wait until it is."""
        await self.ensure_open()

    async def _open(self) -> None:
        """Start the template and the first workers; on failure function jobs run as processes."""
        try:
            self._template = await asyncio.to_thread(self._spawn_template)
            for _ in range(self._size):
                self._fork("")
        except (TemplateFailed, OSError) as exc:
            self.broken = str(exc)
            why = "launcher: no warm Python workers (function jobs start an interpreter each): %s"
            log.error(why, exc)  # noqa: TRY400 - the cause is enough
        finally:
            self._checked_at = time.monotonic()

    def close(self) -> None:
        for worker in self._workers:
            worker.signal(signal.SIGKILL)
            worker.sock.close()
        self._workers.clear()
        for template in [*self._old, *([self._template] if self._template else [])]:
            template.close()
        self._old.clear()
        self._template = None

    def runs(self, app: type[ApplicationDefinition] | None) -> bool:
        """Whether ``app``'s jobs run in a warm worker here (else in a fresh interpreter)."""
        if self.broken is not None or app is None:
            return False
        warm = self._warm_apps.get(app)
        if warm is None:  # once per app class: resolving paths costs more than the job
            warm = app.isolation == "worker" and os.path.realpath(
                app.spec.python_exe
            ) == os.path.realpath(self._python)
            self._warm_apps[app] = warm
        return warm

    # --- jobs -----------------------------------------------------------------------------

    async def start(self, spec: TaskSpec, call: PyCall) -> WarmTask:
        """Hand the job to a worker; ``StartFailed`` if no worker could be had."""
        await self.ensure_open()
        await self._check_apps()
        if self._template is None:
            raise StartFailed(f"job {spec.job_id}: no warm worker template: {self.broken}")
        gpus = ",".join(spec.gpu_ids)
        try:
            worker = self._idle(gpus) or self._fork(gpus)
            job = {"job_id": spec.job_id, "app": call.app, "params_json": call.params_json,
                   "workdir": str(spec.workdir), "env": {**render_env(spec), **call.env},
                   "stdout": str(spec.stdout_path), "stderr": str(spec.stderr_path)}  # fmt: skip
            frames.send(worker.sock, job)
        except (OSError, TemplateFailed) as exc:
            raise StartFailed(f"job {spec.job_id}: no warm worker: {exc}") from exc
        worker.busy = True
        worker.jobs += 1
        return WarmTask(spec, worker, self, time_limit_s=self._settings.time_limit_s)

    def job_ended(self, worker: Worker, answer: dict[str, Any]) -> None:
        """A worker answered: idle again, or retired if it should run no more jobs."""
        worker.busy = False
        rss_mb = int(answer.get("rss_kb", 0)) / 1024
        spare = len(self._workers) > self._size
        if (answer.get("recycle") or worker.jobs >= self._settings.max_jobs or spare
                or rss_mb > self._settings.max_rss_mb or worker.template.stale):  # fmt: skip
            self._retire(worker)

    def worker_died(self, worker: Worker) -> tuple[int, int] | None:
        """A worker's socket closed: its exit status and peak RSS (KiB), once the template
        reports them; None if it never does."""
        worker.gone = True
        worker.busy = False
        self._forget(worker)
        template = worker.template
        deadline = time.monotonic() + EXIT_REPORT_S
        while worker.pid not in template.exits:
            template.drain()
            left = deadline - time.monotonic()
            if worker.pid in template.exits or template.reader.closed or left <= 0:
                break
            select.select([template.sock], [], [], left)
        status = template.exits.pop(worker.pid, None)
        template.watching.discard(worker.pid)
        self._close_if_done(template)
        return status

    # --- workers --------------------------------------------------------------------------

    def _idle(self, gpus: str) -> Worker | None:
        for worker in self._workers:
            if not worker.busy and worker.gpus == gpus and worker.template is self._template:
                return worker
        return None

    def _fork(self, gpus: str) -> Worker:
        template = self._template
        assert template is not None
        if len(self._workers) >= self._size:  # make room: an idle worker bound elsewhere goes
            spare = next((w for w in self._workers if not w.busy), None)
            if spare is not None:
                self._retire(spare)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            frames.send(template.sock, {"op": "fork", "gpus": gpus}, [theirs.fileno()])
        finally:
            theirs.close()
        answer = template.answer(EXIT_REPORT_S)
        if "forked" not in answer:
            ours.close()
            raise TemplateFailed(f"the worker template refused a fork: {answer}")
        ours.setblocking(False)
        worker = Worker(int(answer["forked"]), ours, gpus, template)
        template.watching.add(worker.pid)
        self._workers.append(worker)
        self.forks += 1
        return worker

    def _retire(self, worker: Worker) -> None:
        """Let it go: end of stream tells it to exit; its template reaps it."""
        self._forget(worker)
        worker.gone = True
        worker.sock.close()
        template = worker.template
        template.watching.discard(worker.pid)
        template.exits.pop(worker.pid, None)
        self._close_if_done(template)

    def _forget(self, worker: Worker) -> None:
        with contextlib.suppress(ValueError):
            self._workers.remove(worker)

    def _close_if_done(self, template: Template) -> None:
        if template in self._old and not any(w.template is template for w in self._workers):
            self._old.remove(template)
            template.close()

    # --- apps -----------------------------------------------------------------------------

    async def _check_apps(self) -> None:
        """A new template once the site's apps changed, or once the template is gone (killed
        by hand, by the OOM killer); the old one's busy workers finish their jobs."""
        now = time.monotonic()
        if self._template is None:
            return
        self._template.drain()  # exit notices, and whether it is still there
        if not self._template.reader.closed and now - self._checked_at < APPS_CHECK_S:
            return
        async with self._swap:
            gone = self._template.reader.closed
            if not gone and now - self._checked_at < APPS_CHECK_S:
                return
            self._checked_at = now
            if not gone and fingerprint(self._apps_dir) == self._template.fingerprint:
                return
            why = "the worker template exited" if gone else "the site's apps changed"
            log.info("launcher: %s; new warm workers import the apps", why)
            try:
                fresh = await asyncio.to_thread(self._spawn_template)
            except (TemplateFailed, OSError) as exc:
                if gone:  # nothing to fork from: function jobs start interpreters from now on
                    self.broken = str(exc)
                log.error("launcher: the apps do not import: %s", exc)  # noqa: TRY400
                # A broken edit: keep what works until the apps change again.
                self._template.fingerprint = fingerprint(self._apps_dir)
                return
            old, self._template = self._template, fresh
            old.stale = True
            self._old.append(old)
            for worker in [w for w in self._workers if w.template is old and not w.busy]:
                self._retire(worker)
            self._close_if_done(old)

    def _spawn_template(self) -> Template:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        seen = fingerprint(self._apps_dir)
        argv = [self._python, "-P", "-m", "lodestream.agents.launcher.warm.template",
                "--apps-dir", str(self._apps_dir), "--fd", str(theirs.fileno())]  # fmt: skip
        if self._settings.memory_limit_mb is not None:
            argv += ["--memory-limit-mb", str(self._settings.memory_limit_mb)]
        try:
            proc = subprocess.Popen(
                argv, cwd=self._cwd, env=self._env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), start_new_session=True,
            )  # fmt: skip
        finally:
            theirs.close()
        ours.setblocking(False)
        template = Template(proc, ours, seen)
        try:
            answer = template.answer(READY_TIMEOUT_S)
        except TemplateFailed:
            template.close()
            raise
        if not answer.get("ready"):
            template.close()
            raise TemplateFailed(f"the site's apps do not import: {answer.get('error', answer)}")
        return template


def fingerprint(apps_dir: Path) -> Fingerprint:
    """What identifies the apps as imported: each ``*.py`` file's name, size and mtime."""
    out = []
    with contextlib.suppress(OSError), os.scandir(apps_dir) as entries:
        for entry in entries:
            if entry.name.endswith(".py"):
                st = entry.stat()
                out.append((entry.name, st.st_size, st.st_mtime_ns))
    return tuple(sorted(out))
