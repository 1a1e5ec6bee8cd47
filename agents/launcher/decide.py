"""The pilot's decisions: pure functions from what it observed to what it does next.

:mod:`~lodestream.agents.launcher.launcher` fetches, :mod:`~lodestream.agents.launcher.offering`
places, :mod:`~lodestream.agents.launcher.running` leases, starts, waits and appends, and
:mod:`~lodestream.agents.launcher.stopping` drains; every choice in between is made here,
from plain values (the work item, the app's published steps, a return code, the session's
state), so each can be tested without NATS or processes:

* whether to place a delivery here (or leave it to another pilot, or to none: it can never
  run at this site), and what to do with a second delivery of a job held;
* whether to hand a delivery back for a while so that a pilot whose node caches hold the
  job's inputs takes it (data-aware dispatch);
* whether a job is outside the pilot's tag filter, and how long it waits before it is
  offered again;
* whether the work delivered is the job as submitted;
* which event takes the lease (it is ``job.started`` itself), and what a task that came
  up too late (draining, or the session lost) must do;
* which event reports a run's end, a task that could not start, a drain or a late start,
  and which counter of the pilot's report it adds to once it lands;
* whether a task that died was the scheduler stopping its pilot (a timeout, not an error).

Results are ``(event class, data)`` in an :class:`Outcome`; the caller mints the event
(id, producer time) when it appends it: a pilot's result is a fact observed once, not a
consequence to re-derive as the controller's are.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from lodestream.agents.launcher.report import ExitReason, Tally
from lodestream.agents.site.apps.pyrun import parse_result
from lodestream.agents.site.settings import JobMode
from lodestream.platform_adapters.packing import Allocation, JobRequest
from lodestream.schemas.batch import batch_cause
from lodestream.schemas.envelope import Event, EventData
from lodestream.schemas.events import JobFinished, JobRunDone, JobRunErrored, JobRunTimedOut
from lodestream.schemas.events.job import (
    CacheUseData,
    FinishedData,
    Placement,
    RunProfile,
    RunResultData,
    StartedData,
)
from lodestream.schemas.resources import App, JobSpec, SchedulerState
from lodestream.schemas.states import FINISHED_AT_RUN_END

if TYPE_CHECKING:  # the decisions read an item's fields, never its NATS message
    from lodestream.agents.launcher.work import WorkItem

TAIL_CHARS = 4000


@dataclass(frozen=True, slots=True)
class Outcome:
    """An event to append on the job's chain, and the report counter it adds to once it lands."""

    kind: type[Event]
    data: EventData
    tally: Tally


# --- deliveries -------------------------------------------------------------------------


class Offer(Enum):
    PLACE = "place"  # try to allocate it on our nodes now (nak if they are busy)
    # Nak: another pilot (bigger, in the other mode, or with more time left) may take it.
    NEVER_FITS = "never fits"
    OUT_OF_TIME = "out of time"
    # No pilot of this site can ever run it: fail the run with the reason, visibly.
    NOWHERE = "nowhere"


@dataclass(frozen=True, slots=True)
class SiteShape:
    """What this pilot knows about every pilot of its site, to tell "not here" from "nowhere".

    ``same_nodes``: every pilot of the site has exactly these nodes (the ``local`` machine:
    the site's host, split as its settings say). ``same_node_shape``: every node of every
    pilot has the shape of these (a machine description that states its nodes' cores).
    ``described`` names what fixes them, for the job's error.
    """

    same_nodes: bool = False
    same_node_shape: bool = False
    described: str = ""


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a job is not for this pilot; ``nowhere``: nor for any pilot of its site."""

    reason: str
    nowhere: bool = False


def refusal(
    request: JobRequest,
    *,
    mode: JobMode,
    never_fits: str | None,
    pilot_nodes: int,
    site: SiteShape,
    mpi_broken: str | None = None,
) -> Refusal | None:
    """Why this pilot must not place ``request``, or None.

    ``never_fits`` is the packer's reason why it can never run on this pilot's
    ``pilot_nodes`` nodes. Too many nodes is "nowhere" only when every pilot of the site has
    these nodes; nodes too small, when every node of the site is shaped like these. A serial
    pilot leaves MPI jobs (more than one node or one rank) to the site's mpi-mode pilots. An
    mpi-mode pilot whose probe found its launcher's ranks in no one world (``mpi_broken``,
    :mod:`~lodestream.agents.launcher.probe`) fails them with that reason: the site's
    settings are every pilot's, and run anyway they would be separate programs.
    """
    if never_fits is not None:
        fixed = site.same_nodes if request.num_nodes > pilot_nodes else site.same_node_shape
        if fixed:
            return Refusal(f"{never_fits}; no pilot of this site can run it ({site.described})",
                           nowhere=True)  # fmt: skip
        return Refusal(never_fits)
    if mode == "serial" and (request.num_nodes > 1 or request.ranks_per_node > 1):
        return Refusal(
            f"an MPI job ({request.num_nodes} nodes x {request.ranks_per_node} ranks); "
            "a serial-mode pilot runs single-rank jobs; a pilot in mpi mode takes it"
        )
    if mpi_broken is not None and (request.num_nodes > 1 or request.ranks_per_node > 1):
        return Refusal(
            f"an MPI job ({request.num_nodes} nodes x {request.ranks_per_node} ranks): "
            f"{mpi_broken}",
            nowhere=True,
        )
    return None


def offer(spec: JobSpec, *, refused: Refusal | None, remaining_min: float) -> Offer:
    """Whether to try placing ``spec`` on this pilot's nodes.

    ``refused`` is :func:`refusal`'s verdict; ``remaining_min`` is what is left of the
    pilot's wall time. A job without a wall time (0) is taken whatever remains.
    """
    if refused is not None:
        return Offer.NOWHERE if refused.nowhere else Offer.NEVER_FITS
    if spec.wall_time_min and spec.wall_time_min > remaining_min:
        return Offer.OUT_OF_TIME
    return Offer.PLACE


def beat_interval_s(ttl_s: float) -> float:
    """How often a pilot beats, and so how often it advertises what its caches hold."""
    # A quarter TTL: an outage of up to three quarters of it passes without the server
    # expiring the session.
    return max(ttl_s / 4, 0.5)


def cache_deferral(
    *, here: int, at_peer: int, delivered: int, max_deliveries: int, defer_s: float
) -> float | None:
    """How long to hand a delivery back so that a peer pilot takes it; None: take it here.

    ``here`` and ``at_peer`` are how many of the job's cacheable inputs this pilot's best
    node and the best live peer (by its latest heartbeat) hold. Delay scheduling, as in
    Falkon's data diffusion and Spark's locality wait: a job waits for a pilot that has its
    data only for its first ``max_deliveries`` deliveries (the delivery's ``num_delivered``,
    counted by the server, so no pilot needs to remember it), then runs wherever it is
    offered. No job waits for ever for a cache, and none waits at all when no peer is better.

    ``defer_s`` is the peers' advertisement interval (:func:`beat_interval_s`): a delivery
    handed back for a shorter time comes back before the peer's next heartbeat, and the
    same pilot takes it again (issue 31.13: 2 x 0.25 s against beats every 2.5 s).
    """
    if at_peer <= here or delivered > max_deliveries:
        return None
    return defer_s


class Redelivery(Enum):
    """A second runnable delivery of a job the pilot holds: never a second allocation."""

    # The very message we are leasing from (its ack wait ran out): that lease settles it.
    LEASING = "leasing"
    # An older runnable event than the one we hold: nothing will ever come of it; ack.
    STALE = "stale"
    # A newer runnable event (the job was killed and reset, or our lease expired): what we
    # hold is stale and its lease or result will be refused. Nak: take it once released.
    NEWER = "newer"


def redelivery(seq: int, held_seq: int) -> Redelivery:
    """What a delivery at stream sequence ``seq`` is, for a job held from ``held_seq``."""
    if seq == held_seq:
        return Redelivery.LEASING
    return Redelivery.STALE if seq < held_seq else Redelivery.NEWER


HAND_BACK_FIRST_S = 0.5
"""How long a job outside a pilot's tag filter waits, handed back the first time (or half
that: see :func:`outside_filter`)."""
HAND_BACK_MAX_S = 5.0
"""... and at most, however often it was handed back."""


@dataclass(frozen=True, slots=True)
class HandBack:
    """A job outside this pilot's tag filter: hand it back (nak) to come again after
    ``delay_s``, for whichever pilot fetches then."""

    reason: str
    delay_s: float


def outside_filter(
    tags: Mapping[str, str],
    filter_tags: Mapping[str, str],
    *,
    deliveries: int,
    idle_ttl_s: float,
    jitter: float,
    not_due_s: float = 0.0,
) -> HandBack | None:
    """Whether a job with ``tags`` is not for a pilot whose filter is ``filter_tags``.

    It is for the pilot when its tags include every pair of the filter; an empty filter
    takes every job. A job that is not for it is never leased here: it goes back to the
    consumer, for a pilot whose filter it matches.

    The delay doubles with the job's ``deliveries`` (the consumer's count), from
    :data:`HAND_BACK_FIRST_S`: a job no running pilot wants keeps coming back to the ones
    that do not, and with a fixed half second a pilot with 3,000 such jobs pending spends a
    core handing them back (measured: ~3,300 a second). The cap, :data:`HAND_BACK_MAX_S` and
    a twelfth of the site's ``idle_ttl_s`` (its pilots share it), keeps a dozen chances for a
    pilot that wants the job to be the one it comes back to before that pilot idles out.
    ``jitter`` (uniform in [0, 1), from the caller) takes up to half off, so that jobs
    handed back together do not all come back at one instant, to whichever pilot's pull
    request is the oldest open one then (the launcher also varies its fetch waits, for the
    same reason). A retry that is not due yet (``not_due_s``) waits at least until it is.
    """
    missing = [f"{key}={value}" for key, value in filter_tags.items() if tags.get(key) != value]
    if not missing:
        return None
    grown = HAND_BACK_FIRST_S * 2 ** min(max(deliveries - 1, 0), 16)
    delay = min(grown, HAND_BACK_MAX_S, max(HAND_BACK_FIRST_S, idle_ttl_s / 12))
    delay *= 1 - jitter / 2
    return HandBack(f"its tags lack {', '.join(missing)}", max(delay, not_due_s))


def not_as_submitted(created: JobSpec | None, work: JobSpec) -> str | None:
    """Why ``work`` must not run, given the spec of the job's ``job.created``; None if it may.

    A runnable event is site-writable (``job.preprocessed`` after the site's hook), so
    whoever holds the site key could hand its pilots work nobody submitted; the job's
    ``job.created``, which only the control plane can append, settles it.
    """
    if created is None:
        return "no job.created on the log"
    # As specs: job.created's data adds how its site was chosen, which no work carries.
    spec = set(JobSpec.model_fields)
    if created.model_dump(include=spec) != work.model_dump(include=spec):
        return "its work differs from the job as submitted"
    return None


# --- starting ---------------------------------------------------------------------------


def placement_of(allocation: Allocation) -> tuple[Placement, ...]:
    return tuple(
        Placement(hostname=p.hostname, cores=tuple(int(c) for c in p.cpu_ids),
                  gpus=tuple(int(g) for g in p.gpu_ids if str(g).isdigit()))
        for p in allocation.placements
    )  # fmt: skip


def lease(item: WorkItem, session_id: uuid.UUID, allocation: Allocation) -> StartedData:
    """The payload of the ``job.started`` that takes the lease.

    Chained on the runnable event, ``job.started`` *is* the lease (it skips
    ``job.leased``): exactly one pilot wins it, and the job is RUNNING in one event.
    """
    return StartedData(session_id=session_id, skipped=("job.leased",),
                       placement=placement_of(allocation), attempt=item.attempt)  # fmt: skip


class AfterStart(Enum):
    """What a task that has just come up must do."""

    RUN = "run"  # run to its end and report it
    # The controller expired our session: the job is someone else's. Kill it at once and
    # report nothing (every append on its lease would be refused anyway).
    KILL = "kill"
    # We started draining while it came up: terminate it and report it timed out.
    STOP = "stop"


def after_start(*, lost: bool, draining: bool) -> AfterStart:
    if lost:
        return AfterStart.KILL
    return AfterStart.STOP if draining else AfterStart.RUN


# --- results ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunEnd:
    """What the pilot observed of a task that ended."""

    return_code: int
    runtime_s: float
    stderr_tail: str  # read only when the task failed
    pyrun_result: str | None  # the result file a Python app's wrapper wrote, if any
    # Why the task's end was never observed (its worker rank was lost); None: it was.
    lost: str | None = None
    cache: CacheUseData | None = None  # what its inputs cost at its node's cache, if cached
    profile: RunProfile | None = None  # when it was leased, spawned, started and seen to end


def run_result(item: WorkItem, end: RunEnd, app: App | None) -> Outcome:
    """The event that reports the end of ``item``'s run.

    A Python app's result file that pyrun did not write (the job overwrote it, or
    its value cannot be stored) makes the run an error naming that: the task's own
    output is what the job's owner must see, never a pilot that drops the result.
    """
    if end.lost is not None:
        # Nobody saw how it ended: like a pilot that stopped, not a job that failed, so the
        # site's handle_timeout decides whether it runs again.
        data = RunResultData(cause=(end.lost[:TAIL_CHARS],), runtime_s=end.runtime_s,
                             work=item.spec, attempt=item.attempt, cache=end.cache,
                             profile=end.profile)  # fmt: skip
        return Outcome(JobRunTimedOut, data, Tally.TIMED_OUT)
    tail = end.stderr_tail
    result: Any = None
    if end.pyrun_result is not None:
        try:
            pyrun = parse_result(end.pyrun_result)
        except ValueError as exc:
            return _unusable_result(item, end, f"its result file is not pyrun's: {exc}")
        result = pyrun.result if pyrun.ok else None
        if not pyrun.ok:  # the exception of a Python app says more than its stderr
            tail = pyrun.traceback or pyrun.error or tail
    fields: dict[str, Any] = {"return_code": end.return_code, "stderr_tail": tail[-TAIL_CHARS:],
                              "runtime_s": end.runtime_s, "result": result,
                              "attempt": item.attempt, "cache": end.cache,
                              "profile": end.profile}  # fmt: skip
    try:
        RunResultData(**fields)
    except ValidationError as exc:
        why = "; ".join(str(e["msg"]) for e in exc.errors())
        return _unusable_result(item, end, f"its result cannot be stored: {why}")
    if end.return_code != 0:
        return Outcome(JobRunErrored, RunResultData(**fields, work=item.spec), Tally.ERRORED)
    if app is not None and app.steps(item.spec).nothing_after_run:
        # Nothing happens between RUN_DONE and JOB_FINISHED: one event instead of the
        # run_done the controller would answer with job.finished (docs/architecture.md §4).
        done = FinishedData(skipped=FINISHED_AT_RUN_END, work=item.spec, attempt=item.attempt,
                            run=RunResultData(**fields))  # fmt: skip
        return Outcome(JobFinished, done, Tally.FINISHED)
    # Steps follow the run (or the app is unknown here): job.run_done, which the site's
    # postprocess hook or the controller answers.
    return Outcome(JobRunDone, RunResultData(**fields, work=item.spec), Tally.FINISHED)


def _unusable_result(item: WorkItem, end: RunEnd, why: str) -> Outcome:
    data = RunResultData(return_code=end.return_code, stderr_tail=end.stderr_tail[-TAIL_CHARS:],
                         runtime_s=end.runtime_s, cause=(why[:TAIL_CHARS],), work=item.spec,
                         attempt=item.attempt, cache=end.cache, profile=end.profile)  # fmt: skip
    return Outcome(JobRunErrored, data, Tally.ERRORED)


def start_failure(item: WorkItem, reason: str, cause: str = "task could not start") -> Outcome:
    """The event that reports a task that could not even start; ``reason`` is its error."""
    data = RunResultData(stderr_tail=reason[-TAIL_CHARS:], cause=(cause,),
                         work=item.spec, attempt=item.attempt)  # fmt: skip
    return Outcome(JobRunErrored, data, Tally.ERRORED)


def unrunnable(item: WorkItem, reason: str) -> Outcome:
    """The event that reports a job no pilot of its site can ever run (:attr:`Offer.NOWHERE`).

    The pilot takes the lease (with no placement) only to say so on the job's own history;
    the site's ``handle_error`` and retry budget then fail it, instead of leaving it
    runnable forever with the reason in some pilot's log.
    """
    return start_failure(item, reason, cause="cannot run at this site")


@dataclass(frozen=True, slots=True)
class PilotBatch:
    """The batch job a pilot runs in: the id it was started with (``--batch-job-id``), the
    site's scheduler and the scheduler's id for the job (from the job's environment)."""

    id: uuid.UUID
    scheduler: str = ""
    scheduler_id: str | None = None


WALL_TIME_MARGIN_S = 60.0
"""A stop signal this close to the batch job's end is the scheduler enforcing its wall time."""


def batch_verdict(reason: ExitReason, remaining_s: float) -> str:
    """What ended the pilot's batch job, as far as the pilot can tell when it drains."""
    stopped = reason is ExitReason.STOPPED
    if reason is ExitReason.WALL_TIME or (stopped and remaining_s <= WALL_TIME_MARGIN_S):
        return SchedulerState.WALLTIME_EXPIRED.value
    if stopped:
        return "told to stop (deleted, preempted or shut down)"
    return f"its pilot exits ({reason})"


def drained(
    item: WorkItem,
    session_id: uuid.UUID,
    reason: ExitReason,
    return_code: int | None,
    *,
    batch: PilotBatch | None = None,
    remaining_s: float = math.inf,
) -> Outcome:
    """The event that reports a task the pilot stopped because it is exiting (``reason``).

    RUN_TIMEOUT, not RUN_ERROR: the job did not fail, its pilot ran out of time or was
    told to stop, so the site's ``handle_timeout`` decides whether it runs again. A pilot
    in a batch job names it, and what ended it, as the next link of the cause chain.
    """
    cause = _drain_cause(session_id, reason, batch, remaining_s)
    data = RunResultData(return_code=return_code, cause=cause, work=item.spec,
                         attempt=item.attempt)  # fmt: skip
    return Outcome(JobRunTimedOut, data, Tally.TIMED_OUT)


def _drain_cause(
    session_id: uuid.UUID, reason: ExitReason, batch: PilotBatch | None, remaining_s: float
) -> tuple[str, ...]:
    """The pilot's link of the cause chain, and its batch job's when it runs in one."""
    cause = [f"launcher {session_id} drained: {reason}"]
    if batch is not None:
        verdict = batch_verdict(reason, remaining_s)
        cause.append(batch_cause(batch.id, scheduler=batch.scheduler,
                                 scheduler_id=batch.scheduler_id, verdict=verdict))  # fmt: skip
    return tuple(cause)


STOP_WINDOW_S = 5.0
"""How long before its pilot is told to stop a task's death by a signal is that same stop.

A scheduler that stops a batch job (``scancel``, preemption, its time limit) signals the
job's steps at the same moment as the pilot's own process, and a task (``srun``: 143,
Hydra's ``mpiexec``: 255) may die before the pilot has even been told; a busy node may
deliver the pilot's signal a few seconds after its tasks'."""

# 128 + SIGHUP, SIGINT, SIGKILL, SIGTERM as a shell reports them; 255: Hydra's mpiexec when
# a signal ends its ranks. A negative code is Python's for a signalled child.
_SIGNALLED_CODES = frozenset({129, 130, 137, 143, 255})


def signalled(return_code: int) -> bool:
    """Whether ``return_code`` is how a task (or its launcher) reports a signal's death."""
    return return_code < 0 or return_code in _SIGNALLED_CODES


def ended_by_stop(
    return_code: int, *, ended_at: float, stopped_at: float | None,
    window_s: float = STOP_WINDOW_S,
) -> bool:  # fmt: skip
    """Whether a task that ended with ``return_code`` at ``ended_at`` ended because its pilot
    was told to stop at ``stopped_at`` (both monotonic; None: it was not told).

    A failure after the stop is the stop's, whatever its code (the scheduler's signal reached
    the task, or its launcher, first); one before it only if a signal ended it within
    ``window_s``. A task that succeeded is a success, however late.
    """
    if stopped_at is None or return_code == 0:
        return False
    if ended_at >= stopped_at:
        return True
    return signalled(return_code) and stopped_at - ended_at <= window_s


def ended_with_pilot(
    item: WorkItem,
    session_id: uuid.UUID,
    return_code: int,
    *,
    batch: PilotBatch | None = None,
    remaining_s: float = math.inf,
) -> Outcome:
    """The event that reports a task that died as its pilot was being stopped
    (:func:`ended_by_stop`): RUN_TIMEOUT with the cause chain, as if the drain had stopped
    it, never a run error that spends the job's retry budget."""
    first = f"the task ended (return code {return_code}) as its pilot was told to stop"
    cause = (first, *_drain_cause(session_id, ExitReason.STOPPED, batch, remaining_s))
    data = RunResultData(return_code=return_code, cause=cause, work=item.spec,
                         attempt=item.attempt)  # fmt: skip
    return Outcome(JobRunTimedOut, data, Tally.TIMED_OUT)


def late_start(item: WorkItem, session_id: uuid.UUID) -> Outcome:
    """The event that reports a task that came up after the pilot started draining."""
    data = RunResultData(cause=(f"launcher {session_id} was draining",), work=item.spec,
                         attempt=item.attempt)  # fmt: skip
    return Outcome(JobRunTimedOut, data, Tally.TIMED_OUT)
