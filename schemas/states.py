"""The job state machine, as data (docs/architecture.md §4).

``TRANSITIONS`` is the single table every writer checks before appending
and the projector checks again when folding. Lease events keep the state
and only set or clear the lease; see :mod:`lodestream.schemas.fold`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Literal


class JobState(StrEnum):
    CREATED = "CREATED"
    AWAITING_PARENTS = "AWAITING_PARENTS"
    READY = "READY"
    STAGED_IN = "STAGED_IN"
    PREPROCESSED = "PREPROCESSED"
    RUNNING = "RUNNING"
    RUN_DONE = "RUN_DONE"
    RUN_ERROR = "RUN_ERROR"
    RUN_TIMEOUT = "RUN_TIMEOUT"
    RESTART_READY = "RESTART_READY"
    POSTPROCESSED = "POSTPROCESSED"
    STAGED_OUT = "STAGED_OUT"
    JOB_FINISHED = "JOB_FINISHED"
    FAILED = "FAILED"
    KILLED = "KILLED"


S = JobState
RUNNABLE: Final = frozenset({S.PREPROCESSED, S.RESTART_READY})
FINAL: Final = frozenset({S.JOB_FINISHED, S.FAILED, S.KILLED})
NON_FINAL: Final = frozenset(JobState) - FINAL

Writer = Literal["control", "site"]
"""Who may append an event, by credential: ``control`` is the control plane (api on behalf of
a user, controller); ``site`` is a site's own key (its agent and its launchers share it). The
server's permissions are rendered from this (:mod:`lodestream.infra.nats.auth`), so an event on
the log
was appended by one of its type's writers, whatever its payload claims."""
CONTROL: Final[frozenset[Writer]] = frozenset({"control"})
SITE: Final[frozenset[Writer]] = frozenset({"site"})
BOTH: Final[frozenset[Writer]] = frozenset({"control", "site"})

LeaseEffect = Literal["none", "acquire", "release", "require", "end"]
"""What an event does to the lease: ``acquire`` needs none held and sets one;
``release`` needs one held and clears it; ``require`` needs one held and keeps
it; ``end`` clears it if held (run results, kills); ``none`` leaves it alone."""


@dataclass(frozen=True, slots=True)
class Transition:
    event: str
    sources: frozenset[JobState | None]
    target: JobState | None  # None: the state does not change
    lease: LeaseEffect
    appended_by: str
    writers: frozenset[Writer]


def _t(  # noqa: PLR0917 - one row of the table reads best positionally
    event: str,
    sources: frozenset[JobState | None] | set[JobState | None],
    target: JobState | None,
    appended_by: str,
    writers: frozenset[Writer],
    lease: LeaseEffect = "none",
) -> Transition:
    return Transition(event, frozenset(sources), target, lease, appended_by, writers)


TRANSITIONS: Final[dict[str, Transition]] = {
    t.event: t
    for t in (
        _t("job.created", {None}, S.CREATED, "api", CONTROL),
        _t("job.awaiting_parents", {S.CREATED}, S.AWAITING_PARENTS, "controller", CONTROL),
        _t("job.ready", {S.CREATED, S.AWAITING_PARENTS}, S.READY, "controller", CONTROL),
        _t("job.staged_in", {S.READY}, S.STAGED_IN, "site transfer module / controller", BOTH),
        _t("job.preprocessed", {S.STAGED_IN}, S.PREPROCESSED, "site processing", BOTH),
        _t("job.leased", set(RUNNABLE), None, "launcher", SITE, lease="acquire"),
        _t("job.lease_released", set(RUNNABLE), None, "launcher", SITE, lease="release"),
        _t("job.lease_expired", set(RUNNABLE), None, "controller", CONTROL, lease="release"),
        # A pilot that can never run the job says so; the job stays runnable for another.
        _t("job.placement_refused", set(RUNNABLE), None, "launcher", SITE),
        _t("job.started", set(RUNNABLE), S.RUNNING, "lease holder", SITE, lease="require"),
        _t("job.run_done", {S.RUNNING}, S.RUN_DONE, "lease holder", SITE, lease="end"),
        _t("job.run_errored", {S.RUNNING}, S.RUN_ERROR, "lease holder", SITE, lease="end"),
        _t(
            "job.run_timed_out",
            {S.RUNNING},
            S.RUN_TIMEOUT,
            "lease holder / controller",
            BOTH,
            "end",
        ),
        _t(
            "job.postprocessed", {S.RUN_DONE}, S.POSTPROCESSED, "site processing / controller", BOTH
        ),
        _t(
            "job.restart_ready",
            {S.RUN_ERROR, S.RUN_TIMEOUT},
            S.RESTART_READY,
            "site processing",
            SITE,
        ),
        _t("job.staged_out", {S.POSTPROCESSED}, S.STAGED_OUT, "site transfer / controller", BOTH),
        _t("job.finished", {S.STAGED_OUT}, S.JOB_FINISHED, "controller / lease holder", BOTH),
        # Failure: parent failed (CREATED/AWAITING_PARENTS), stage-in failed (READY),
        # preprocess hook failed (STAGED_IN), retry budget spent (RUN_ERROR/RUN_TIMEOUT),
        # postprocess hook failed (RUN_DONE), stage-out failed (POSTPROCESSED).
        _t(
            "job.failed",
            {
                S.CREATED,
                S.AWAITING_PARENTS,
                S.READY,
                S.STAGED_IN,
                S.RUN_DONE,
                S.RUN_ERROR,
                S.RUN_TIMEOUT,
                S.POSTPROCESSED,
            },
            S.FAILED,
            "controller / site",
            BOTH,
        ),
        _t("job.killed", set(NON_FINAL), S.KILLED, "api (user)", CONTROL, lease="end"),
        _t("job.reset", {S.FAILED, S.KILLED}, S.READY, "api (user)", CONTROL),
    )
}

SKIPPABLE: Final = frozenset(
    {
        "job.ready",
        "job.staged_in",
        "job.preprocessed",
        "job.leased",
        "job.run_done",
        "job.postprocessed",
        "job.staged_out",
    }
)
"""Steps that may be recorded as skipped inside a later event instead of appended on their own.

``job.run_done`` is the one step that is not empty: the lease holder may fold it into
``job.finished`` when nothing follows the run, and the event must then carry the run's
result (:mod:`lodestream.schemas.fold` refuses it otherwise).
"""
CREATED_RUNNABLE: Final = ("job.ready", "job.staged_in", "job.preprocessed")
"""What a ``job.created`` may skip: these three, in this order, or nothing.

The api creates a job runnable (PREPROCESSED) when it has no parents, nothing to stage and
no ``preprocess`` hook at its app, as the api's read model of apps shows it when the job is
submitted; the pilots then lease it from ``launch-<site>`` with no controller step between.
The fold checks what the event itself shows (no parents, no transfer items); the hook is
the control plane's call, which no site can forge (``job.created`` is a control type).
"""
RUN_CARRIERS: Final = frozenset({"job.finished"})
"""Events that may stand for ``job.run_done`` (with the run's result in ``data.run``)."""
FINISHED_AT_RUN_END: Final = ("job.run_done", "job.postprocessed", "job.staged_out")
"""What a lease holder's ``job.finished`` stands for when nothing follows the run."""
