"""What a pilot runs for a work item, and what it observes when the task ends. No NATS here.

What it then reports is decided in :mod:`~lodestream.agents.launcher.decide`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from lodestream.agents.launcher.decide import RunEnd
from lodestream.agents.launcher.tasks import Tracked
from lodestream.agents.launcher.work import WorkItem
from lodestream.agents.site.apps import ApplicationDefinition, JobContext
from lodestream.agents.site.apps.render import PYRUN_RESULT, PyCall, render_job
from lodestream.platform_adapters.launchers.base import TaskSpec
from lodestream.platform_adapters.packing import Allocation
from lodestream.schemas.events.job import RunProfile


def task_spec(
    item: WorkItem,
    allocation: Allocation,
    app: type[ApplicationDefinition] | None,
    *,
    data_dir: Path,
    base_env: Mapping[str, str],
) -> TaskSpec | str:
    """The task to start for ``item``, or why it cannot start (it becomes the job's error).

    No I/O: the caller creates the workdir (:func:`make_workdir`) where blocking is harmless.
    """
    start = job_start(item, allocation, app, data_dir=data_dir, base_env=base_env)
    return start if isinstance(start, str) else start[0]


def job_start(
    item: WorkItem,
    allocation: Allocation,
    app: type[ApplicationDefinition] | None,
    *,
    data_dir: Path,
    base_env: Mapping[str, str],
) -> tuple[TaskSpec, PyCall | None] | str:
    """:func:`task_spec`, and the call a warm Python worker may make in place of its script."""
    if app is None:
        return f"app {item.spec.app!r} is not defined at site {item.site}"
    workdir = data_dir / item.spec.workdir
    try:
        context = JobContext.from_spec(item.job_id, item.spec, data_dir, attempt=item.attempt)
        rendered = render_job(app, context)
        direct = rendered.direct
        spec = TaskSpec(
            job_id=str(item.job_id), script=rendered.script, workdir=workdir,
            env=base_env, argv=direct.argv if direct else None,
            argv_env=direct.env if direct else {},
            allocation=allocation, stdout_path=workdir / "job.out",
            stderr_path=workdir / "job.err", ranks_per_node=item.spec.ranks_per_node,
            threads_per_rank=item.spec.threads_per_rank,
            threads_per_core=item.spec.threads_per_core,
            gpus_per_rank=item.spec.gpus_per_rank, launch_params=item.spec.launch_params,
        )  # fmt: skip
    except Exception as exc:  # site code (the app's template) may fail any way it likes
        return f"{type(exc).__name__}: {exc}"
    return spec, rendered.call


def make_workdir(spec: TaskSpec) -> None:
    """Create the task's workdir (and its parents): a filesystem round trip, so it is made
    in the worker thread that starts the task, never on the event loop."""
    spec.workdir.mkdir(parents=True, exist_ok=True)


def run_end(
    item: WorkItem,
    tracked: Tracked,
    code: int,
    data_dir: Path,
    *,
    python_app: bool,
    leased_at: float | None = None,
) -> RunEnd:
    """What the pilot can observe of ``tracked``'s run, which ended with exit ``code``.

    Only a Python-function app (``python_app``) has a result file, written by its pyrun
    wrapper: a shell app's is never looked for (a file of that name is the job's own
    output, not a result; and a failed open per job costs the event loop more than the rest
    of the observation). ``leased_at`` (``time.time()`` when the lease was acknowledged) adds
    the run's profile.
    """
    runtime = time.monotonic() - tracked.started
    profile = None if leased_at is None else profile_of(leased_at, tracked)
    lost = tracked.task.lost
    if lost is not None:  # its runner went away: there is no status or output to read
        return RunEnd(return_code=code, runtime_s=runtime, stderr_tail="", pyrun_result=None,
                      lost=lost, profile=profile)  # fmt: skip
    tail = "" if code == 0 else tracked.task.stderr_tail()
    pyrun = _read_result(data_dir / item.spec.workdir / PYRUN_RESULT) if python_app else None
    return RunEnd(return_code=code, runtime_s=runtime, stderr_tail=tail, pyrun_result=pyrun,
                  profile=profile)  # fmt: skip


def profile_of(leased_at: float, tracked: Tracked) -> RunProfile | None:
    """The run's profile from the pilot's wall-clock captures; None if that clock stepped
    back during the run (the times would not be ordered): the result matters, not its timing.
    """
    try:
        return RunProfile(
            leased_at=_utc(leased_at), spawning_at=_utc(tracked.spawning_at),
            started_at=_utc(tracked.started_at),
            exited_at=None if tracked.exited_at is None else _utc(tracked.exited_at),
            pid=tracked.task.pid,
        )  # fmt: skip
    except ValidationError:
        return None


def _utc(stamp: float) -> datetime:
    return datetime.fromtimestamp(stamp, UTC)


def _read_result(path: Path) -> str | None:
    """The result file's text; what cannot be read becomes text ``run_result`` refuses."""
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return None
    except OSError as exc:  # written by the job: a directory, unreadable, ...
        return f"<unreadable: {exc.strerror}>"
