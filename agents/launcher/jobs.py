"""What a pilot runs for a work item, and what it reports when the task ends. No NATS here."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lodestream.agents.launcher.tasks import Tracked
from lodestream.agents.launcher.work import WorkItem
from lodestream.agents.site.apps import ApplicationDefinition, JobContext
from lodestream.agents.site.apps.pyrun import parse_result
from lodestream.agents.site.apps.render import PYRUN_RESULT, render_job
from lodestream.platform_adapters.launchers.base import TaskSpec
from lodestream.platform_adapters.packing import Allocation
from lodestream.schemas.envelope import Event, EventData
from lodestream.schemas.events import JobFinished, JobRunDone, JobRunErrored
from lodestream.schemas.events.job import FinishedData, Placement, RunResultData
from lodestream.schemas.resources import App
from lodestream.schemas.states import FINISHED_AT_RUN_END

TAIL_CHARS = 4000


def placement_of(allocation: Allocation) -> tuple[Placement, ...]:
    return tuple(
        Placement(hostname=p.hostname, cores=tuple(int(c) for c in p.cpu_ids),
                  gpus=tuple(int(g) for g in p.gpu_ids if str(g).isdigit()))
        for p in allocation.placements
    )  # fmt: skip


def task_spec(
    item: WorkItem,
    allocation: Allocation,
    app: type[ApplicationDefinition] | None,
    *,
    data_dir: Path,
    base_env: Mapping[str, str],
) -> TaskSpec | str:
    """The task to start for ``item``, or why it cannot start (it becomes the job's error)."""
    if app is None:
        return f"app {item.spec.app!r} is not defined at site {item.site}"
    workdir = data_dir / item.spec.workdir
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        context = JobContext.from_spec(item.job_id, item.spec, data_dir, attempt=item.attempt)
        rendered = render_job(app, context)
        direct = rendered.direct
        return TaskSpec(
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


def start_failure(item: WorkItem, reason: str) -> tuple[type[Event], EventData]:
    """The event that reports a task that could not even start."""
    data = RunResultData(stderr_tail=reason[-TAIL_CHARS:], cause=("task could not start",),
                         work=item.spec, attempt=item.attempt)  # fmt: skip
    return JobRunErrored, data


def exit_result(
    item: WorkItem, tracked: Tracked, code: int, app: App | None, data_dir: Path
) -> tuple[type[Event], EventData]:
    """The event that reports the end of ``tracked``'s run with exit ``code``."""
    runtime = time.monotonic() - tracked.started
    tail = "" if code == 0 else tracked.task.stderr_tail()
    result: Any = None
    pyrun = data_dir / item.spec.workdir / PYRUN_RESULT
    if pyrun.exists():
        outcome = parse_result(pyrun.read_text())
        result = outcome.result if outcome.ok else None
        if not outcome.ok:
            tail = outcome.traceback or outcome.error or tail
    fields: dict[str, Any] = {"return_code": code, "stderr_tail": tail[-TAIL_CHARS:],
                              "runtime_s": runtime, "result": result,
                              "attempt": item.attempt}  # fmt: skip
    if code == 0 and app is not None and app.steps(item.spec).nothing_after_run:
        # Nothing happens between RUN_DONE and JOB_FINISHED: one event instead of the
        # run_done the controller would answer with job.finished (ARCHITECTURE.md §4).
        done = FinishedData(skipped=FINISHED_AT_RUN_END, work=item.spec, attempt=item.attempt,
                            run=RunResultData(**fields))  # fmt: skip
        return JobFinished, done
    return (JobRunDone if code == 0 else JobRunErrored), RunResultData(**fields, work=item.spec)
