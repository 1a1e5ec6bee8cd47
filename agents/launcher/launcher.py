"""The pilot: lease runnable work for its site, pack it on its nodes, run it, report it.

Every job goes through one chain of compare-and-set appends:

    runnable event (seq s0) ──job.started(skipped: leased)──▶ s1 ──job.run_done|errored──▶ s2

``job.started`` with expect=s0 *is* the lease: exactly one launcher wins it.
A successful run that nothing follows (no ``postprocess`` hook, no stage-out)
is reported as ``job.finished`` standing for ``job.run_done`` too, with the
run's result in it: one event fewer per job on the common path.
The result chains on s1; if that append conflicts, the controller expired
the lease in between (the pilot was paused or cut off) — the pilot was
fenced, and its task is killed at once. A pilot that finds its heartbeat
lapsed (``session.lost``) kills everything it runs: its jobs belong to
someone else now.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.errors import ConnectionClosedError, NoRespondersError
from nats.js import JetStreamContext
from nats.js.errors import APIError

from agents.launcher.session import LauncherSession
from agents.launcher.tasks import Reaper, Tracked
from agents.launcher.work import NotWork, WorkItem, work_item
from agents.site.apps import ApplicationDefinition, JobContext, to_app_model
from agents.site.apps.pyrun import parse_result
from agents.site.apps.render import PYRUN_RESULT, render_job
from lodestream.eventlog import ConflictError, EventLog, EventLogError
from lodestream.eventlog.pull import pull_consumer
from platform_adapters.compute.base import NodeSpec
from platform_adapters.launchers.base import AppLauncher, TaskSpec
from platform_adapters.packing import Allocation, JobRequest, NodePacker
from schemas.envelope import Event, EventData
from schemas.events import JobFinished, JobRunDone, JobRunErrored, JobRunTimedOut, JobStarted
from schemas.events.job import FinishedData, Placement, RunResultData, StartedData
from schemas.resources import NodeInfo
from schemas.states import FINISHED_AT_RUN_END

log = logging.getLogger(__name__)
NAK_DELAY_S = 0.5


@dataclass(slots=True)
class LauncherReport:
    started: int = 0
    finished: int = 0
    errored: int = 0
    lost_races: int = 0
    fenced: int = 0
    timed_out: int = 0
    killed: int = 0
    exit_reason: str = ""


class Launcher:
    def __init__(
        self,
        js: JetStreamContext,
        *,
        site: str,
        session: LauncherSession,
        apps: dict[str, type[ApplicationDefinition]],
        app_launcher: AppLauncher,
        nodes: list[NodeSpec],
        data_dir: Path,
        idle_ttl_s: float,
        max_fetch: int = 256,
        base_env: Mapping[str, str] | None = None,
        nc: Any = None,
    ) -> None:
        self._js = js
        self._nc = nc
        self._log = EventLog(js)
        self._site = site
        self.session = session
        self._apps = apps
        # Their published interface: which steps follow a run (shared with the controller).
        self._app_models = {name: to_app_model(cls, site) for name, cls in apps.items()}
        self._app_launcher = app_launcher
        self._nodes = nodes
        self._packer = NodePacker(nodes)
        self._data_dir = data_dir
        self._idle_ttl_s = idle_ttl_s
        self._max_fetch = max_fetch
        self._base_env = dict(base_env or {})  # tasks inherit only what the entry point passes
        self._reaper = Reaper()
        self._jobs: set[asyncio.Task[None]] = set()
        # job id -> last sequence of our CAS chain; present only while we may still report
        self._chains: dict[str, int] = {}
        self._items: dict[str, WorkItem] = {}
        self._freed = asyncio.Event()
        self._draining = False
        self.report = LauncherReport()

    # --- lifecycle ------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> LauncherReport:
        nodes = [NodeInfo(hostname=n.hostname, cores=max(len(n.cpu_ids), 1), gpus=len(n.gpu_ids))
                 for n in self._nodes]  # fmt: skip
        await self.session.open(socket.gethostname(), "serial", nodes)
        reaper_stop = asyncio.Event()
        beat_stop = asyncio.Event()
        background = [
            asyncio.create_task(self._reaper.run(reaper_stop)),
            asyncio.create_task(self.session.heartbeat_forever(self._stats, beat_stop)),
        ]
        kills = None
        if self._nc is not None:
            kills = await self._nc.subscribe(f"evt.{self._site}.job.*.killed", cb=self._on_killed)
        try:
            self.report.exit_reason = await self._lease_loop(stop)
        finally:
            if self.session.lost:
                self._kill_all("session lost: heartbeat lapsed")
            else:
                await self._drain(self.report.exit_reason)
            if self._jobs:
                await asyncio.gather(*self._jobs, return_exceptions=True)
            if kills is not None:
                await kills.unsubscribe()
            reaper_stop.set()
            beat_stop.set()
            await asyncio.gather(*background, return_exceptions=True)
            if not self.session.lost:
                await self.session.close(self.report.exit_reason)
        return self.report

    async def _lease_loop(self, stop: asyncio.Event) -> str:
        sub = await pull_consumer(self._js, "EVENTS", f"launch-{self._site}")
        idle_since = time.monotonic()
        try:
            while not stop.is_set():
                if self.session.lost:
                    return "session lost"
                if self.session.remaining_min() <= 0:
                    return "wall time reached"
                if self._jobs:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > self._idle_ttl_s:
                    return "idle"
                if self._packer.idle_node_count == 0 and not self._has_free_cpu():
                    self._freed.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._freed.wait(), 0.5)
                    continue
                try:
                    msgs = await sub.fetch(self._fetch_size(), timeout=0.25)
                except TimeoutError:  # nats-py raises its subclass or asyncio.TimeoutError
                    continue
                except (ConnectionClosedError, NoRespondersError, APIError) as exc:
                    log.warning("launcher: fetch failed (%s); retrying", exc)
                    await asyncio.sleep(0.5)
                    continue
                for msg in msgs:
                    await self._offer(msg)
            return "stopped"
        finally:
            with contextlib.suppress(ConnectionClosedError):
                await sub.stop()

    def _fetch_size(self) -> int:
        # Every job offered holds its allocation from the lease on, not only once it runs:
        # fetching more than that would hand the surplus back (nak) and delay it.
        free = sum(max(len(n.cpu_ids), 1) for n in self._nodes) - len(self._jobs)
        return max(1, min(self._max_fetch, free))

    def _has_free_cpu(self) -> bool:
        return any(node.fits(1, 0, 0.0) for node in self._packer.nodes)

    def _stats(self) -> tuple[int, int, int]:
        free = sum(n.idle_cpu_count for n in self._packer.nodes)
        return len(self._reaper), len(self._jobs), free

    # --- one job --------------------------------------------------------------------------

    async def _offer(self, msg: Any) -> None:
        try:
            item = work_item(msg)
        except NotWork as exc:
            log.warning("launcher: dropping delivery: %s", exc)
            await msg.ack()
            return
        request = JobRequest.from_resources(str(item.job_id), item.spec)
        never = self._packer.can_ever_fit(request)
        wall = item.spec.wall_time_min
        if never is not None or (wall and wall > self.session.remaining_min()):
            # Another pilot (bigger, or with more time left) may take it.
            await msg.nak(delay=NAK_DELAY_S)
            return
        allocation = self._packer.allocate(request)
        if allocation is None:
            await msg.nak(delay=NAK_DELAY_S)
            return
        job = asyncio.create_task(self._run_job(item, allocation))
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)

    async def _run_job(self, item: WorkItem, allocation: Allocation) -> None:
        job_id = str(item.job_id)
        self._items[job_id] = item
        try:
            started = await self._lease(item, allocation)
            if started is None:
                return
            tracked = await self._start(item, allocation)
            if isinstance(tracked, str):
                data = RunResultData(stderr_tail=tracked[-4000:], cause=("task could not start",),
                                     work=item.spec, attempt=item.attempt)  # fmt: skip
                if await self._report(item, JobRunErrored, data):
                    self.report.errored += 1
                return
            if self.session.lost or self._draining:
                await self._stop_late_start(item, tracked)
                return
            code = await tracked.done
            await self._report_exit(item, tracked, code)
        finally:
            self._chains.pop(job_id, None)
            self._items.pop(job_id, None)
            self._packer.release(job_id)
            self._freed.set()

    async def _lease(self, item: WorkItem, allocation: Allocation) -> int | None:
        placement = tuple(
            Placement(hostname=p.hostname, cores=tuple(int(c) for c in p.cpu_ids),
                      gpus=tuple(int(g) for g in p.gpu_ids if str(g).isdigit()))
            for p in allocation.placements
        )  # fmt: skip
        started = JobStarted.create(
            site=self._site, aggregate_id=item.job_id, actor=self.session.actor,
            data=StartedData(session_id=self.session.id, skipped=("job.leased",),
                             placement=placement, attempt=item.attempt),
        )  # fmt: skip
        try:
            seq = (await self._log.append(started, expect=item.seq)).seq
        except ConflictError:
            self.report.lost_races += 1  # another pilot, or the job moved on (killed, …)
            await item.msg.ack()
            return None
        await item.msg.ack()
        self._chains[str(item.job_id)] = seq
        self.report.started += 1
        return seq

    async def _start(self, item: WorkItem, allocation: Allocation) -> Tracked | str:
        """Start the task; on failure return the reason (it becomes the job's error).

        fork/exec of the job's shell takes milliseconds; it runs in a worker thread so
        that spawns overlap and the event loop keeps leasing and reporting meanwhile.
        """
        spec = self._task_spec(item, allocation)
        if isinstance(spec, str):
            return spec
        try:
            task = await asyncio.to_thread(self._app_launcher.start, spec)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return self._reaper.track(task)

    def _task_spec(self, item: WorkItem, allocation: Allocation) -> TaskSpec | str:
        job_id = str(item.job_id)
        workdir = self._data_dir / item.spec.workdir
        app = self._apps.get(item.spec.app)
        if app is None:
            return f"app {item.spec.app!r} is not defined at site {self._site}"
        try:
            workdir.mkdir(parents=True, exist_ok=True)
            context = JobContext.from_spec(item.job_id, item.spec, self._data_dir,
                                           attempt=item.attempt)  # fmt: skip
            rendered = render_job(app, context)
            direct = rendered.direct
            return TaskSpec(
                job_id=job_id, script=rendered.script, workdir=workdir,
                env=self._base_env, argv=direct.argv if direct else None,
                argv_env=direct.env if direct else {},
                allocation=allocation, stdout_path=workdir / "job.out",
                stderr_path=workdir / "job.err", ranks_per_node=item.spec.ranks_per_node,
                threads_per_rank=item.spec.threads_per_rank,
                threads_per_core=item.spec.threads_per_core,
                gpus_per_rank=item.spec.gpus_per_rank, launch_params=item.spec.launch_params,
            )  # fmt: skip
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    async def _report_exit(self, item: WorkItem, tracked: Tracked, code: int) -> None:
        runtime = time.monotonic() - tracked.started
        workdir = self._data_dir / item.spec.workdir
        result: Any = None
        tail = "" if code == 0 else tracked.task.stderr_tail()
        pyrun = workdir / PYRUN_RESULT
        if pyrun.exists():
            outcome = parse_result(pyrun.read_text())
            result = outcome.result if outcome.ok else None
            if not outcome.ok:
                tail = (outcome.traceback or outcome.error or tail)[-4000:]
        fields: dict[str, Any] = {"return_code": code, "stderr_tail": tail[-4000:],
                                  "runtime_s": runtime, "result": result,
                                  "attempt": item.attempt}  # fmt: skip
        app = self._app_models.get(item.spec.app)
        kind: type[Event]
        data: EventData
        if code == 0 and app is not None and app.steps(item.spec).nothing_after_run:
            # Nothing happens between RUN_DONE and JOB_FINISHED: one event instead of the
            # run_done the controller would answer with job.finished (ARCHITECTURE.md §4).
            kind = JobFinished
            data = FinishedData(skipped=FINISHED_AT_RUN_END, work=item.spec, attempt=item.attempt,
                                run=RunResultData(**fields))  # fmt: skip
        else:
            kind = JobRunDone if code == 0 else JobRunErrored
            data = RunResultData(**fields, work=item.spec)
        if await self._report(item, kind, data):
            if code == 0:
                self.report.finished += 1
            else:
                self.report.errored += 1

    async def _report(self, item: WorkItem, kind: type[Event], data: EventData) -> bool:
        """Append the job's run result on our chain; each job gets at most one result."""
        job_id = str(item.job_id)
        expect = self._chains.pop(job_id, None)
        if expect is None:
            return False  # already reported (drained) or killed as fenced
        event = kind.create(site=self._site, aggregate_id=item.job_id, actor=self.session.actor,
                            data=data)  # fmt: skip
        try:
            await self._log.append(event, expect=expect)
        except ConflictError:
            self.report.fenced += 1
            log.warning("launcher: fenced on job %s (lease expired); result dropped", job_id)
            return False
        except EventLogError:
            log.exception("launcher: could not report job %s", job_id)
            return False
        return True

    async def _on_killed(self, msg: Any) -> None:
        """A user killed one of our running jobs: stop the task; the kill is its final word."""
        job_id = msg.subject.split(".")[3]
        for tracked in self._reaper.running():
            if tracked.task.job_id == job_id:
                self._chains.pop(job_id, None)
                tracked.task.terminate(grace_s=2.0)
                self.report.killed += 1

    # --- stopping -------------------------------------------------------------------------

    async def _stop_late_start(self, item: WorkItem, tracked: Tracked) -> None:
        """A task that came up after we started draining (or were fenced) must not run."""
        if self.session.lost:
            self._chains.pop(tracked.task.job_id, None)
            tracked.task.kill()
            self.report.fenced += 1
            return
        tracked.task.terminate(grace_s=2.0)
        data = RunResultData(cause=(f"launcher {self.session.id} was draining",),
                             work=item.spec, attempt=item.attempt)  # fmt: skip
        if await self._report(item, JobRunTimedOut, data):
            self.report.timed_out += 1

    async def _drain(self, reason: str) -> None:
        """Kill what still runs and record it as RUN_TIMEOUT, chained on our lease."""
        self._draining = True
        # Take the chains first, so a task that dies of our SIGTERM is not reported as an error.
        draining = [
            (tracked, item, self._chains.pop(job_id))
            for tracked in self._reaper.running()
            if (job_id := tracked.task.job_id) in self._chains
            and (item := self._items.get(job_id)) is not None
        ]
        for tracked, _, _ in draining:
            tracked.task.terminate(grace_s=2.0)
        for tracked, item, expect in draining:
            data = RunResultData(return_code=tracked.task.returncode,
                                 cause=(f"launcher {self.session.id} drained: {reason}",),
                                 work=item.spec, attempt=item.attempt)  # fmt: skip
            self._chains[tracked.task.job_id] = expect
            if await self._report(item, JobRunTimedOut, data):
                self.report.timed_out += 1

    def _kill_all(self, reason: str) -> None:
        """Our session lapsed: the controller has fenced these jobs; stop them, report nothing."""
        for tracked in self._reaper.running():
            log.warning("launcher: killing job %s: %s", tracked.task.job_id, reason)
            self._chains.pop(tracked.task.job_id, None)
            tracked.task.kill()
            self.report.fenced += 1
