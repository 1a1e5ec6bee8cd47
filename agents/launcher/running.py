"""The run of one job the pilot placed: lease it, start it, wait for it, report it.

Every job goes through one chain of compare-and-set appends:

    runnable event (seq s0) ──job.started(skipped: leased)──▶ s1 ──job.run_done|errored──▶ s2

``job.started`` with expect=s0 *is* the lease: exactly one launcher wins it. The result
chains on s1 (:meth:`Running.report`); if that append conflicts, the controller expired the
lease in between and the pilot was fenced. The job's slot is given back when its task has
ended, not when its result has been appended, so that the next job runs while the log takes
the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import replace
from typing import Any, Final

from nats.js import JetStreamContext

from lodestream.agents.launcher import decide
from lodestream.agents.launcher.appends import KEPT, append_or_keep, append_patiently
from lodestream.agents.launcher.config import PilotConfig, PilotParts
from lodestream.agents.launcher.consumer import NAK_DELAY_S, NAME, skip
from lodestream.agents.launcher.decide import AfterStart, Outcome
from lodestream.agents.launcher.diffusion import count
from lodestream.agents.launcher.jobs import job_start, make_workdir, run_end
from lodestream.agents.launcher.reads import created_spec
from lodestream.agents.launcher.session import LauncherSession
from lodestream.agents.launcher.state import PilotState
from lodestream.agents.launcher.tasks import Tracked
from lodestream.agents.launcher.work import NotWork, WorkItem
from lodestream.agents.site.apps import to_app_model
from lodestream.eventlog import ConflictError, EventLog
from lodestream.eventlog.kernel import ACK, Nak, settle
from lodestream.platform_adapters.errors import StartFailed
from lodestream.platform_adapters.launchers.base import AppLauncher, RunningTask, TaskSpec
from lodestream.platform_adapters.packing import Allocation
from lodestream.schemas.envelope import Event
from lodestream.schemas.events import JobStarted

log = logging.getLogger(__name__)
# A runnable event whose job.created is not found is refused only at its 5th delivery (a
# few seconds on): a lagging replica catches up by then, a forged event stays forged.
MISSING_CREATED_DELIVERIES: Final = 5
MISSING_CREATED_NAK_DELAY_S: Final = 1.0


class Running:
    def __init__(
        self,
        js: JetStreamContext,
        session: LauncherSession,
        pilot: PilotConfig,
        parts: PilotParts,
        state: PilotState,
        *,
        event_log: EventLog,
    ) -> None:
        self._js = js
        self._log = event_log
        self._session = session
        self._pilot = pilot
        self._parts = parts
        self._state = state
        # Their published interface: which steps follow a run (shared with the controller).
        self._app_models = {name: to_app_model(cls, pilot.site) for name, cls in parts.apps.items()}
        self._base_env = dict(pilot.base_env)

    async def run_job(
        self, item: WorkItem, allocation: Allocation, check: asyncio.Task[bool] | None = None
    ) -> None:
        """Check, lease, run and report ``item``; ``check``: its check begun while it was kept."""
        try:
            submitted = await check if check is not None else await self._submitted(item)
            leased_at = await self._lease(item, allocation) if submitted else None
            if leased_at is not None:
                await self._run_leased(item, allocation, leased_at)
        except Exception:  # one job's surprise must not leak its allocation or stop the pilot
            log.exception("launcher: job %s failed unexpectedly", item.job_id)
        finally:
            await self._free(item, allocation)
            self._state.forget(item.key)

    async def fail_unrunnable(self, item: WorkItem, why: str) -> None:
        """Lease a job no pilot of the site can run, only to record why on its history."""
        nowhere = Allocation(str(item.job_id), ())  # the lease holds no node
        try:
            if await self._submitted(item) and await self._lease(item, nowhere) is not None:
                await self.report(item, decide.unrunnable(item, why))
        except Exception:
            log.exception("launcher: job %s failed unexpectedly", item.job_id)
        finally:
            self._state.forget(item.key)

    async def _free(self, item: WorkItem, allocation: Allocation) -> None:
        """Give the job's slot back (once): when its task has ended, not when its result has
        been appended, so that the next job runs while the log takes the result."""
        if item.key not in self._state.placed:
            return
        self._state.placed.discard(item.key)
        if self._parts.diffusion is not None:
            await self._parts.diffusion.release(item, allocation)
        self._state.packer.release(str(item.job_id))
        self._state.freed.set()
        if self._state.waiting and self._state.place_waiting is not None:
            await self._state.place_waiting()  # kept for this moment: no fetch in between

    async def _run_leased(self, item: WorkItem, allocation: Allocation, leased_at: float) -> None:
        state, diffusion = self._state, self._parts.diffusion
        cached = None
        if diffusion is not None:  # ours now: its workdir may be touched
            cached = await diffusion.provide(item, allocation)
            count(state.report, cached)
        tracked = await self._start(item, allocation)
        if isinstance(tracked, str):
            await self.report(item, decide.start_failure(item, tracked))
            return
        match decide.after_start(lost=self._gone(), draining=state.draining):
            case AfterStart.KILL:  # fenced: the job is someone else's now
                state.chains.pop(item.key, None)
                tracked.task.kill()
                state.report.fenced += 1
            case AfterStart.STOP:  # came up after we started draining: must not run
                tracked.task.terminate(grace_s=2.0)
                await self.report(item, decide.late_start(item, self._session.id))
            case AfterStart.RUN:
                code = await tracked.done
                ended_at = time.monotonic()
                await self._free(item, allocation)  # the result is appended on the job's chain
                # (Not a task we stopped ourselves, which has no chain left to report on.)
                if item.key in state.chains and await self._ended_by_stop(code, ended_at):
                    outcome = decide.ended_with_pilot(
                        item, self._session.id, code, batch=self._pilot.batch,
                        remaining_s=self._session.remaining_min() * 60,
                    )  # fmt: skip
                    await self.report(item, outcome)
                    return
                app = self._app_models.get(item.spec.app)
                end = run_end(item, tracked, code, self._pilot.data_dir, leased_at=leased_at,
                              python_app=app is not None and app.python)  # fmt: skip
                end = replace(end, cache=cached)
                await self.report(item, decide.run_result(item, end, app))

    async def check_kept(self, item: WorkItem) -> bool:
        """:meth:`_submitted` for a delivery kept beside full slots. One that fails it is
        settled there and no longer kept; one placed meanwhile gets this answer in
        :meth:`run_job`."""
        if await self._submitted(item):
            return True
        state = self._state
        if state.waiting.pop(item.key, None) is not None:
            state.held.pop(item.key, None)
        return False

    async def _submitted(self, item: WorkItem) -> bool:
        """Run only what a user submitted, as it was submitted (:func:`decide.not_as_submitted`)."""
        if item.submitted:  # the delivery is the job.created: nothing to read back
            return True
        try:
            created = await created_spec(self._js, self._pilot.site, item.job_id)
        except NotWork as exc:  # what the log holds fails the shared rule
            why: str | None = str(exc)
        except Exception as exc:  # NATS away: someone (maybe we) will try again
            log.warning("launcher: cannot check job %s yet: %s", item.job_id, exc)
            await settle(item.msg, Nak(NAK_DELAY_S), NAME)
            return False
        else:
            why = decide.not_as_submitted(created, item.spec)
        if why is None:
            return True
        if created is None and _deliveries(item.msg) < MISSING_CREATED_DELIVERIES:
            # A direct get may be answered by a replica that has not yet stored the job's
            # job.created (one that was cut off, catching up): ask again before refusing.
            log.warning("launcher: job %s: no job.created on the log yet; asking again",
                        item.job_id)  # fmt: skip
            await settle(item.msg, Nak(MISSING_CREATED_NAK_DELAY_S), NAME)
            return False
        await skip(item.msg, f"job {item.job_id}: {why}", self._state.report)
        return False

    async def _lease(self, item: WorkItem, allocation: Allocation) -> float | None:
        """Take the lease; when it was acknowledged (``time.time()``), or None if not taken."""
        started = JobStarted.create(
            site=self._pilot.site,
            aggregate_id=item.job_id,
            actor=self._session.actor,
            data=decide.lease(item, self._session.id, allocation),
        )
        try:
            seq = await self._append(started, item.seq)
        except ConflictError:
            self._state.report.lost_races += 1  # another pilot, or the job moved on (killed, …)
            await settle(item.msg, ACK, NAME)
            return None
        except Exception:
            log.exception("launcher: could not lease job %s", item.job_id)
            seq = None
        if seq is None:  # another pilot may take it; if ours had landed, CAS refuses theirs
            await settle(item.msg, Nak(NAK_DELAY_S), NAME)
            return None
        leased_at = time.time()  # the run's profile: a capture, not another await
        await settle(item.msg, ACK, NAME)
        self._state.chains[item.key] = seq
        self._state.report.started += 1
        return leased_at

    async def _start(self, item: WorkItem, allocation: Allocation) -> Tracked | str:
        """Start the task; on failure return the reason (it becomes the job's error).

        Creating the workdir and fork/exec of the job take milliseconds on a busy
        filesystem; both run in a worker thread so that spawns overlap and the event loop
        keeps leasing and reporting meanwhile. A workdir that cannot be made fails the start
        like a task that cannot be executed: the error names it.
        """
        spawning_at = time.time()
        app = self._parts.apps.get(item.spec.app)
        start = job_start(item, allocation, app, data_dir=self._pilot.data_dir,
                          base_env=self._base_env)  # fmt: skip
        if isinstance(start, str):
            return start
        spec, call = start
        warm, reaper = self._parts.warm, self._state.reaper
        if call is not None and warm is not None and warm.runs(app):
            try:  # a frame to a forked worker: no thread, no exec
                task: RunningTask = await warm.start(spec, call)
            except StartFailed as exc:
                return str(exc)
            return reaper.track(task, spawning_at=spawning_at)
        try:
            task, started_at = await asyncio.to_thread(_spawn, self._parts.app_launcher, spec)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return reaper.track(task, spawning_at=spawning_at, started_at=started_at)

    async def report(self, item: WorkItem, outcome: Outcome) -> None:
        """Append the job's run result on our chain; each job gets at most one result."""
        state = self._state
        expect = state.chains.pop(item.key, None)
        if expect is None:
            return  # already reported (drained) or killed as fenced
        event = outcome.kind.create(site=self._pilot.site, aggregate_id=item.job_id,
                                    actor=self._session.actor, data=outcome.data)  # fmt: skip
        try:
            seq = await append_or_keep(
                self._log, self._parts.outbox, event, expect, until=self._until(),
                gone=self._gone,
            )  # fmt: skip
        except ConflictError:
            state.report.fenced += 1
            log.warning("launcher: fenced on job %s (lease expired); result dropped", item.job_id)
            self._session.suspect()  # was it the whole session? the next beat asks
            return
        except Exception:
            log.exception("launcher: could not report job %s", item.job_id)
            return
        if seq is None:
            log.error("launcher: result of job %s never acknowledged; its lease will expire",
                      item.job_id)  # fmt: skip
            return
        if seq == KEPT:  # the hub decides when it hears of it (agents/site/forward.py)
            state.report.kept += 1
            return
        state.report.count(outcome.tally)

    async def _append(self, event: Event, expect: int) -> int | None:
        return await append_patiently(self._log, event, expect, until=self._until(),
                                      gone=self._gone)  # fmt: skip

    def _until(self) -> float:
        """Until when an append is retried: a drain's end, or the session's."""
        return self._state.drain_until if self._state.draining else self._session.deadline

    def _gone(self) -> bool:
        """Whether nothing can be reported any more: the session or the credential is gone."""
        return self._session.lost or self._state.revoked

    async def _ended_by_stop(self, code: int, ended_at: float) -> bool:
        """Whether a task that ended with ``code`` died of its pilot being stopped.

        The scheduler signals the task and the pilot at once (``scancel``, preemption, its
        time limit), and the task may die first: one that a signal ended waits a moment for
        the pilot's own signal before it is taken for a failure (:data:`decide.STOP_WINDOW_S`).
        """
        state = self._state
        if code != 0 and state.stopped_at is None and decide.signalled(code):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.stopping.wait(), decide.STOP_WINDOW_S)
        return decide.ended_by_stop(code, ended_at=ended_at, stopped_at=state.stopped_at)


def _spawn(app_launcher: AppLauncher, spec: TaskSpec) -> tuple[RunningTask, float]:
    """Make the task's workdir and start the task (in a worker thread); say when its start
    returned, before the hop back to the event loop: that is when the process was started."""
    make_workdir(spec)
    task = app_launcher.start(spec)
    return task, time.time()


def _deliveries(msg: Any) -> int:
    """How many times JetStream has delivered ``msg`` (1 the first time)."""
    try:
        return int(msg.metadata.num_delivered)
    except (AttributeError, TypeError, ValueError):  # not a JetStream delivery
        return 1
