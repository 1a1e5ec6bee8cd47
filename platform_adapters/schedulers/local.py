"""The local scheduler: each batch job is a detached process on this host (laptops, tests).

A job is a directory under ``state_dir/jobs/<id>`` (ids count up from 1) holding its request
and what ``local_wrapper.py`` records as it runs the script: its pid, when the script started,
how it ended. Everything is in files, so an agent that restarts finds its jobs again, and two
adapters on one ``state_dir`` see the same jobs. Jobs start at once; the node count is
recorded but every job runs on this host. Wall time is enforced (SIGTERM, then SIGKILL after
``grace_s``); ``seconds_per_minute`` shrinks a minute for tests.

The script runs with bash, in the directory it is in, with the submitter's environment plus
``request.env`` and ``LODE_SCHEDULER_ID``; its output goes to ``<stem>.<id>.out`` / ``.err``
beside it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from lodestream.platform_adapters.errors import (
    SchedulerUnavailable,
    SubmitRejected,
    UnknownBatchJob,
)
from lodestream.platform_adapters.schedulers.base import (
    BatchRecord,
    BatchRequest,
    BatchStatus,
    Capabilities,
    Scheduler,
)
from lodestream.platform_adapters.schedulers.local_wrapper import write_whole
from lodestream.platform_adapters.schedulers.timeparse import from_epoch, seconds_between
from lodestream.schemas.resources import SchedulerState

WRAPPER: Final = Path(__file__).with_name("local_wrapper.py")
_START_TIMEOUT_S = 30.0

# How the wrapper says the job ended (``result.json``'s reason); "exited" depends on the status.
LOCAL_END_STATES: Final[Mapping[str, SchedulerState]] = MappingProxyType({
    "walltime": SchedulerState.WALLTIME_EXPIRED,
    "cancelled": SchedulerState.CANCELLED,
    "error": SchedulerState.FAILED,  # the script could not be started
})  # fmt: skip


class LocalScheduler(Scheduler):
    """Batch jobs as detached local processes (see the module doc)."""

    name = "local"
    capabilities = Capabilities(backfill=False, accounting=True)

    def __init__(
        self,
        state_dir: Path,
        *,
        seconds_per_minute: float = 60.0,
        grace_s: float = 10.0,
        python: str = sys.executable,
    ) -> None:
        self.jobs_dir = Path(state_dir) / "jobs"
        self.seconds_per_minute = seconds_per_minute
        self.grace_s = grace_s
        self.python = python
        self.hostname = socket.gethostname()

    def render_script_header(self, request: BatchRequest) -> str:
        """No directives: the local scheduler reads none. A comment records the request."""
        words = [f"nodes={request.nodes}", f"wall_time_min={request.wall_time_min}"]
        if request.queue:
            words.append(f"queue={request.queue}")
        return f"# lodestream local batch job: {' '.join(words)}\n"

    def submit_request(self, script_path: Path, request: BatchRequest) -> str:
        if not script_path.is_file():
            raise SubmitRejected(f"local: no batch script {script_path}")
        job_id, job_dir = self._new_job_dir()
        write_whole(job_dir / "job.json", json.dumps(_meta(script_path, request)) + "\n")
        stem = script_path.parent / script_path.stem
        argv = [
            self.python, "-I", str(WRAPPER), str(job_dir),
            repr(request.wall_time_min * self.seconds_per_minute), repr(self.grace_s),
            str(script_path), f"{stem}.{job_id}.out", f"{stem}.{job_id}.err",
        ]  # fmt: skip
        env = {**os.environ, **request.env, "LODE_SCHEDULER_ID": job_id}
        try:
            with (job_dir / "wrapper.err").open("wb") as wrapper_err:
                starter = subprocess.Popen(
                    argv,
                    env=env,
                    cwd=script_path.parent,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=wrapper_err,
                )
            returncode = starter.wait(timeout=_START_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            if isinstance(exc, subprocess.TimeoutExpired):
                starter.kill()
            shutil.rmtree(job_dir, ignore_errors=True)
            raise SchedulerUnavailable(f"local: cannot start the job wrapper: {exc}") from exc
        if returncode != 0 or not (job_dir / "wrapper.pid").exists():
            said = (job_dir / "wrapper.err").read_text(errors="replace").strip()[-500:]
            shutil.rmtree(job_dir, ignore_errors=True)  # never accepted: no trace in status()
            raise SubmitRejected(f"local: the job wrapper exited {returncode}: {said}")
        return job_id

    def _new_job_dir(self) -> tuple[str, Path]:
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        number = max((int(p.name) for p in self.jobs_dir.iterdir() if p.name.isdigit()), default=0)
        while True:
            number += 1
            try:
                (self.jobs_dir / str(number)).mkdir()
            except FileExistsError:
                continue  # another adapter on this state_dir took it
            return str(number), self.jobs_dir / str(number)

    def list_jobs(self, ids: tuple[str, ...] | None) -> dict[str, BatchStatus]:
        if ids is None:
            ids = tuple(p.name for p in self._job_dirs())
        found: dict[str, BatchStatus] = {}
        for job_id in ids:
            status = self._status(job_id)
            if status is not None:
                found[job_id] = status
        return found

    def _job_dirs(self) -> list[Path]:
        if not self.jobs_dir.is_dir():
            return []
        return sorted(
            (p for p in self.jobs_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
        )

    def _read(self, job_id: str) -> _LocalJob | None:
        job_dir = self.jobs_dir / job_id
        meta = _read_json(job_dir / "job.json") if job_id.isdigit() else None
        if meta is None:
            return None
        started = from_epoch(_read_float(job_dir / "started"))
        result: Mapping[str, Any] | None = _read_json(job_dir / "result.json")
        if result is None and not _alive(job_dir) and not _being_submitted(job_dir, meta):
            # It may have written its result between the two looks.
            result = _read_json(job_dir / "result.json") or _LOST
        return _LocalJob(job_id, meta, started, result)

    def _status(self, job_id: str) -> BatchStatus | None:
        job = self._read(job_id)
        if job is None:
            return None
        return BatchStatus(
            scheduler_id=job_id,
            state=job.state,
            native_state=job.native_state,
            nodes=int(job.meta["nodes"]),
            hostnames=(self.hostname,) if job.started else (),
            queue=str(job.meta["queue"]),
            wall_time_min=int(job.meta["wall_time_min"]),
            start_time=job.started,
            elapsed_s=seconds_between(job.started, job.ended or datetime.now(UTC)),
            reason=job.reason,
            exit_code=job.returncode,
            name=str(job.meta.get("job_name", "")),
        )

    def delete_job(self, scheduler_id: str) -> bool:
        job = self._read(scheduler_id)
        if job is None or job.result is not None:
            return False
        pid = _read_pid(self.jobs_dir / scheduler_id)
        if pid is None:
            return False
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return False
        return True

    def read_accounting(self, scheduler_id: str) -> BatchRecord:
        status = self._status(scheduler_id)
        if status is None:
            raise UnknownBatchJob(f"local: no job {scheduler_id} in {self.jobs_dir}")
        job = self._read(scheduler_id)
        ended = job.ended if job is not None and status.final else None
        return replace(BatchRecord.from_status(status), end_time=ended)


_LOST: Final[Mapping[str, Any]] = MappingProxyType({
    "reason": "lost",
    "returncode": None,
    "error": "the job's wrapper ended without recording how (host rebooted? killed?)",
})  # fmt: skip


@dataclass(frozen=True, slots=True)
class _LocalJob:
    job_id: str
    meta: Mapping[str, Any]
    started: datetime | None
    result: Mapping[str, Any] | None

    @property
    def native_state(self) -> str:
        if self.result is not None:
            return str(self.result["reason"])
        return "running" if self.started else "starting"

    @property
    def returncode(self) -> int | None:
        code = self.result.get("returncode") if self.result is not None else None
        return code if isinstance(code, int) else None

    @property
    def state(self) -> SchedulerState:
        if self.result is None:
            return SchedulerState.RUNNING if self.started else SchedulerState.QUEUED
        if self.native_state == "exited":
            return SchedulerState.FINISHED if self.returncode == 0 else SchedulerState.FAILED
        return LOCAL_END_STATES.get(self.native_state, SchedulerState.FAILED)

    @property
    def ended(self) -> datetime | None:
        ended = self.result.get("ended") if self.result is not None else None
        return from_epoch(ended) if isinstance(ended, int | float) else None

    @property
    def reason(self) -> str:
        return str(self.result.get("error", "")) if self.result is not None else ""


def _meta(script_path: Path, request: BatchRequest) -> dict[str, Any]:
    return {
        "script": str(script_path),
        "nodes": request.nodes,
        "queue": request.queue,
        "project": request.project,
        "wall_time_min": request.wall_time_min,
        "job_name": request.job_name,
        "submitted": time.time(),
    }


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _read_float(path: Path) -> float | None:
    try:
        return float(path.read_text())
    except (OSError, ValueError):
        return None


def _read_pid(job_dir: Path) -> int | None:
    try:
        return int((job_dir / "wrapper.pid").read_text())
    except (OSError, ValueError):
        return None


def _being_submitted(job_dir: Path, meta: Mapping[str, Any]) -> bool:
    """A job whose submit has not yet seen its wrapper start (another thread, another agent)."""
    submitted = meta.get("submitted")
    young = isinstance(submitted, int | float) and time.time() - submitted < _START_TIMEOUT_S
    return young and not (job_dir / "wrapper.pid").exists()


def _alive(job_dir: Path) -> bool:
    """Whether the job's wrapper still runs: its pid exists and (on Linux) is still the wrapper,
    not a zombie or a reused pid."""
    pid = _read_pid(job_dir)
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, as another user: not ours, but not provably dead either
    cmdline = Path(f"/proc/{pid}/cmdline")
    if not cmdline.parent.parent.joinpath("self").exists():
        return True  # no /proc to tell a reused pid by
    try:
        return str(job_dir).encode() in cmdline.read_bytes()
    except OSError:
        return False
