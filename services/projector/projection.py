"""Folding one batch of decoded messages into row changes — no I/O.

The caller supplies what the batch needs from earlier batches (the progress
columns of jobs it touches, the owners of sites) through :class:`Known`, and
gets back a :class:`Changes` to write in one transaction. The rebuild keeps
one ``Known`` for the whole replay; the live projector loads it per batch.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from lodestream.schemas.batch import next_batch_state
from lodestream.schemas.envelope import Event
from lodestream.schemas.errors import IllegalTransition
from lodestream.schemas.events import (
    AppLoadFailed,
    AppRegistered,
    AppRemoved,
    AppUpdated,
    BatchJobDeletionRequested,
    BatchJobFinished,
    BatchJobQueued,
    BatchJobRequested,
    BatchJobRunning,
    BatchJobSubmitFailed,
    BatchJobSubmitted,
    JobCreated,
    JobFailed,
    JobFinished,
    JobPlacementRefused,
    JobRunDone,
    JobRunErrored,
    JobRunTimedOut,
    JobStarted,
    ScalerBacklog,
    ScalerDecided,
    SessionClosed,
    SessionExpired,
    SessionOpened,
    SiteKeyBound,
    SiteLocationsSet,
    SiteRegistered,
    SiteRemoved,
    TransferFailed,
    TransferRequested,
    TransferSubmitted,
    TransferSucceeded,
)
from lodestream.schemas.events.job import FinishedData, RunResultData
from lodestream.schemas.events.scaler import scaler_id
from lodestream.schemas.fold import apply, check_creation
from lodestream.schemas.ids import derived_id
from lodestream.schemas.resources import BatchJobState, TransferState
from lodestream.schemas.xfer import next_xfer_state
from lodestream.services.projector.messages import (
    Decoded,
    EventMessage,
    ExpiryMarker,
    HeartbeatMessage,
    RawMessage,
)
from lodestream.services.projector.rows import (
    JobEventRow,
    JobProgress,
    JobRecord,
    QuarantineRow,
    jsonb,
)


@dataclass(frozen=True, slots=True)
class Op:
    """A change to a low-volume read model, executed in log order by the store."""

    statement: str
    params: dict[str, Any]


@dataclass(slots=True)
class Known:
    """State from earlier batches that this batch folds onto."""

    jobs: dict[uuid.UUID, JobProgress | JobRecord] = field(default_factory=dict)
    site_owners: dict[str, str] = field(default_factory=dict)  # live sites only
    batch_states: dict[uuid.UUID, BatchJobState] = field(default_factory=dict)
    xfer_states: dict[uuid.UUID, tuple[str, TransferState]] = field(default_factory=dict)


@dataclass(slots=True)
class Changes:
    new_jobs: dict[uuid.UUID, JobRecord] = field(default_factory=dict)
    updated_jobs: dict[uuid.UUID, JobProgress] = field(default_factory=dict)
    job_events: list[JobEventRow] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    quarantine: list[QuarantineRow] = field(default_factory=list)
    last_seq: dict[str, int] = field(default_factory=dict)

    def empty(self) -> bool:
        return not (
            self.new_jobs or self.updated_jobs or self.job_events or self.ops or self.quarantine
        )


# The aggregates a batch folds onto from earlier batches, and loads when they are not known.
LOADED_KINDS = ("job", "batch", "xfer")
# A job's last_error while a pilot's refusal is the newest word on it (job.placement_refused):
# `lode job show` and the API's job reads say why no pilot takes it.
REFUSED_BY = "no pilot takes it: refused by pilot "
# The states in which a batch job's reason is the scheduler's word on it as it stands.
_OBSERVED = frozenset({BatchJobState.QUEUED, BatchJobState.RUNNING})


def ids_to_load(
    decoded: Iterable[Decoded | QuarantineRow],
) -> tuple[set[uuid.UUID], set[uuid.UUID], set[uuid.UUID]]:
    """The jobs, batch jobs and transfers a batch's events name (one pass: the live
    projector asks for every batch), each the id of a row the batch may fold onto."""
    ids: dict[str, set[uuid.UUID]] = {kind: set() for kind in LOADED_KINDS}
    for message in decoded:
        if isinstance(message, EventMessage):
            named = ids.get(message.event.kind)
            if named is not None:
                named.add(message.event.aggregate_id)
    return ids["job"], ids["batch"], ids["xfer"]


class Projection:
    """Fold decoded messages onto ``known``; record what to write in ``changes``."""

    def __init__(self, known: Known, changes: Changes) -> None:
        self.known = known
        self.changes = changes

    def fold(self, raw: RawMessage, decoded: Decoded | QuarantineRow) -> None:
        previous = self.changes.last_seq.get(raw.stream, 0)
        self.changes.last_seq[raw.stream] = max(previous, raw.seq)
        if isinstance(decoded, QuarantineRow):
            self.changes.quarantine.append(decoded)
            return
        try:
            self._fold(decoded)
        except IllegalTransition as exc:
            self.changes.quarantine.append(
                QuarantineRow(raw.stream, raw.seq, raw.subject, f"illegal: {exc}", raw.data)
            )

    def _fold(self, message: Decoded) -> None:
        match message:
            case EventMessage(seq=seq, event=event) if event.kind == "job":
                self._job(seq, event)
            case EventMessage(seq=seq, event=event):
                self._other(seq, event)
            case HeartbeatMessage(site=site, session_id=session_id, heartbeat=hb):
                self._op(
                    "heartbeat",
                    id=session_id,
                    site=site,
                    at=hb.at,
                    heartbeat=hb.model_dump_json(),
                )
            case ExpiryMarker(site=site, session_id=session_id):
                self._op("session_expired", id=session_id, site=site)

    # --- jobs: the hot path -------------------------------------------------------------

    def _job(self, seq: int, event: Event) -> None:
        job_id = event.aggregate_id
        current = self.known.jobs.get(job_id)
        if isinstance(event, JobCreated):
            if current is not None:
                raise IllegalTransition(f"job {job_id} already exists")
            owner = self.known.site_owners.get(event.site)
            check_creation(event, owner)
            assert owner is not None  # checked above
            view = apply(None, event, seq)
            record = JobRecord(event, seq, owner, JobProgress(view))
            self.known.jobs[job_id] = record
            self.changes.new_jobs[job_id] = record
            self._job_event(seq, event, None, view.state.value)
            return
        if current is None:
            raise IllegalTransition(f"{event.type} for unknown job {job_id}")
        progress = current.progress if isinstance(current, JobRecord) else current
        before = progress.view.state
        progress.view = apply(progress.view, event, seq)
        _record_outcome(progress, event)
        if job_id not in self.changes.new_jobs:
            self.changes.updated_jobs[job_id] = progress
        self._job_event(seq, event, before.value, progress.view.state.value)

    def _job_event(self, seq: int, event: Event, before: str | None, after: str) -> None:
        self.changes.job_events.append(
            JobEventRow(
                seq=seq,
                job_id=event.aggregate_id,
                event_id=event.id,
                site=event.site,
                type=event.type,
                from_state=before,
                to_state=after,
                occurred_at=event.occurred_at,
                actor=event.actor,
                data=event.data.model_dump_json(),
            )
        )

    # --- sites, apps, batch jobs, sessions, transfers ---------------------------------

    def _other(self, seq: int, event: Event) -> None:
        handler = {
            "site": self._site,
            "app": self._app,
            "batch": self._batch_event,
            "session": self._session,
            "xfer": self._xfer_event,
            "scaler": self._scaler,
        }.get(event.kind)
        if handler is None:
            raise IllegalTransition(f"no projection for {event.type}")
        handler(seq, event)

    def _site(self, seq: int, event: Event) -> None:
        base = {"site": event.site, "seq": seq, "at": event.occurred_at}
        match event:
            case SiteRegistered(data=data):
                if event.aggregate_id != derived_id("site", data.name) or data.name != event.site:
                    raise IllegalTransition("site.registered does not match its site name")
                if event.actor != f"user:{data.owner}":
                    raise IllegalTransition(f"site registered by {event.actor} for {data.owner}")
                if event.site in self.known.site_owners:
                    raise IllegalTransition(f"site {event.site!r} is already registered")
                self.known.site_owners[event.site] = data.owner
                self._op(
                    "site_registered",
                    **base,
                    id=event.aggregate_id,
                    owner=data.owner,
                    description=data.description,
                    public_key=data.public_key,
                )
            case SiteKeyBound(data=data):
                self._require_owner(event)
                self._op("site_key_bound", **base, public_key=data.public_key)
            case SiteRemoved():
                self._require_owner(event)
                del self.known.site_owners[event.site]
                self._op("site_removed", **base)
            case SiteLocationsSet(data=data):
                self._require_site_actor(event)
                if event.aggregate_id != derived_id("site", event.site):
                    raise IllegalTransition("site.locations_set is not on the site's aggregate")
                self._op("site_locations", **base, locations=jsonb(data.locations))

    def _app(self, seq: int, event: Event) -> None:
        base = {"site": event.site, "seq": seq, "at": event.occurred_at}
        self._require_site_actor(event)
        match event:
            case AppRegistered(data=app) | AppUpdated(data=app):
                if app.site != event.site:
                    raise IllegalTransition(f"app for site {app.site!r} appended by {event.site!r}")
                self._op(
                    "app_upserted",
                    **base,
                    name=app.name,
                    description=app.description,
                    parameters=jsonb(
                        {k: v.model_dump(mode="json") for k, v in app.parameters.items()}
                    ),
                    transfers=jsonb(
                        {k: v.model_dump(mode="json") for k, v in app.transfers.items()}
                    ),
                    python=app.python,
                    hooks=jsonb(list(app.hooks)),
                    version=app.version,
                )
            case AppRemoved(data=data):
                self._op("app_removed", **base, name=data.name)
            case AppLoadFailed(data=failed):
                where = failed.source + (f":{failed.line}" if failed.line else "")
                self._op("app_load_failed", **base, names=list(failed.apps),
                         error=f"{where}: {failed.message}")  # fmt: skip

    def _batch_event(self, seq: int, event: Event) -> None:
        if event.actor.startswith("user:"):
            self._require_owner(event)  # a user asks only the sites they own for pilots
        elif event.site not in self.known.site_owners:
            raise IllegalTransition(f"{event.type} for unregistered site {event.site!r}")
        batch_id = event.aggregate_id
        state = next_batch_state(self.known.batch_states.get(batch_id), event.type)
        self.known.batch_states[batch_id] = state
        match event:
            case BatchJobRequested(data=data):
                self._op(
                    "batch_requested",
                    site=event.site,
                    seq=seq,
                    at=event.occurred_at,
                    id=batch_id,
                    **data.model_dump(exclude={"filter_tags", "options"}),
                    filter_tags=jsonb(data.filter_tags),
                    options=jsonb(data.options),
                    requested_by=event.actor,
                )
            case BatchJobSubmitted(data=data):
                self._batch(event, seq, state, scheduler_id=data.scheduler_id,
                            scheduler=data.scheduler or None)  # fmt: skip
            case BatchJobFinished(data=data):
                self._batch(event, seq, state, exit_code=data.exit_code, reason=data.reason,
                            scheduler_state=data.state or None)  # fmt: skip
            case BatchJobSubmitFailed(data=data) | BatchJobDeletionRequested(data=data):
                self._batch(event, seq, state, reason=data.reason)
            case BatchJobQueued(data=data) | BatchJobRunning(data=data) if state in _OBSERVED:
                # Why it waits (Slurm's Priority, PartitionNodeLimit): cleared once it runs. A
                # deletion's reason stays while the scheduler still lists the job.
                self._batch(event, seq, state, reason=data.reason)
            case _:
                self._batch(event, seq, state)

    def _session(self, seq: int, event: Event) -> None:
        base = {"site": event.site, "seq": seq, "at": event.occurred_at, "id": event.aggregate_id}
        match event:
            case SessionOpened(data=data):
                self._op(
                    "session_opened",
                    **base,
                    batch_job_id=data.batch_job_id,
                    hostname=data.hostname,
                    mode=data.mode,
                    nodes=jsonb([n.model_dump(mode="json") for n in data.nodes]),
                    deadline=data.deadline,
                    heartbeat_ttl_s=data.heartbeat_ttl_s,
                )
            case SessionClosed(data=data):
                self._op("session_ended", **base, state="closed", reason=data.reason)
            case SessionExpired(data=data):
                self._op("session_ended", **base, state="expired", reason=data.reason)

    def _xfer_event(self, seq: int, event: Event) -> None:
        if event.site not in self.known.site_owners:
            raise IllegalTransition(f"{event.type} for unregistered site {event.site!r}")
        known = self.known.xfer_states.get(event.aggregate_id)
        if known is not None and known[0] != event.site:
            raise IllegalTransition(f"transfer item {event.aggregate_id} is not at {event.site!r}")
        state = next_xfer_state(known[1] if known else None, event.type)
        self.known.xfer_states[event.aggregate_id] = (event.site, state)
        match event:
            case TransferRequested(data=data):
                self._op(
                    "xfer_requested",
                    site=event.site,
                    seq=seq,
                    at=event.occurred_at,
                    id=event.aggregate_id,
                    job_id=data.job_id,
                    slot=data.slot,
                    direction=data.direction,
                    remote=data.remote.model_dump_json(),
                    local_path=data.local_path,
                    step_id=data.step_id,
                )
            case TransferSubmitted(data=data):
                self._xfer(event, seq, state, task_id=data.task_id, attempts=data.attempt)
            case TransferFailed(data=data):
                self._xfer(event, seq, state, reason=data.reason, attempts=data.attempts,
                           permanent=data.permanent)  # fmt: skip
            case TransferSucceeded(data=data):
                self._xfer(event, seq, state, attempts=data.attempts,
                           bytes_transferred=data.bytes_transferred,
                           duration_s=data.duration_s, cached=data.cached)  # fmt: skip

    def _scaler(self, seq: int, event: Event) -> None:
        if event.site not in self.known.site_owners:
            raise IllegalTransition(f"{event.type} for unregistered site {event.site!r}")
        if event.aggregate_id != scaler_id(event.site):
            raise IllegalTransition(f"{event.type} is not on site {event.site!r}'s scaler")
        base = {"site": event.site, "seq": seq, "at": event.occurred_at}
        match event:
            case ScalerBacklog(data=data):
                self._op("scaler_backlog", **base, scaler_id=event.aggregate_id,
                         backlog=data.model_dump_json())  # fmt: skip
            case ScalerDecided(data=data):
                self._op("scaler_decided", **base, scaler_id=event.aggregate_id)
                self._op(
                    "scaler_decision",
                    **base,
                    id=event.id,
                    backlog_id=data.backlog_id,
                    queued=data.queued,
                    running=data.running,
                    reason=data.reason,
                    requests=jsonb([r.model_dump(mode="json") for r in data.requests]),
                    deletions=jsonb([d.model_dump(mode="json") for d in data.deletions]),
                    inputs=data.model_dump_json(include={"backlog", "windows", "limits"}),
                )

    def _batch(self, event: Event, seq: int, state: BatchJobState, **values: Any) -> None:
        fields = {"scheduler_id": None, "scheduler": None, "scheduler_state": None,
                  "exit_code": None, "reason": None} | values  # fmt: skip
        self._op(
            "batch_state",
            id=event.aggregate_id,
            site=event.site,
            seq=seq,
            at=event.occurred_at,
            state=state.value,
            **fields,
        )

    def _xfer(self, event: Event, seq: int, state: TransferState, **values: Any) -> None:
        unset = ("task_id", "reason", "attempts", "permanent", "bytes_transferred", "duration_s",
                 "cached")  # fmt: skip
        fields = dict.fromkeys(unset) | values
        self._op(
            "xfer_state",
            id=event.aggregate_id,
            site=event.site,
            seq=seq,
            at=event.occurred_at,
            state=state.value,
            **fields,
        )

    def _require_owner(self, event: Event) -> None:
        owner = self.known.site_owners.get(event.site)
        if owner is None:
            raise IllegalTransition(f"{event.type} for unregistered site {event.site!r}")
        if event.actor != f"user:{owner}":
            raise IllegalTransition(f"{event.type} by {event.actor}, not the site owner")

    def _require_site_actor(self, event: Event) -> None:
        if event.site not in self.known.site_owners:
            raise IllegalTransition(f"{event.type} for unregistered site {event.site!r}")
        if event.actor != f"site:{event.site}":
            raise IllegalTransition(f"{event.type} must come from site:{event.site}")

    def _op(self, statement: str, **params: Any) -> None:
        self.changes.ops.append(Op(statement, params))


def _record_outcome(progress: JobProgress, event: Event) -> None:
    match event:
        case JobRunDone(data=data):
            progress.return_code = data.return_code
        case JobFinished(data=FinishedData(run=RunResultData() as run)):
            progress.return_code = run.return_code  # the pilot finished it at the run's end
        case JobRunErrored(data=data) | JobRunTimedOut(data=data):
            progress.return_code = data.return_code
            progress.last_error = data.stderr_tail or "; ".join(data.cause) or None
        case JobFailed(data=data):
            progress.last_error = "; ".join((data.reason, *data.cause))
        case JobPlacementRefused(data=data):
            progress.last_error = f"{REFUSED_BY}{data.session_id}: {data.reason}"
        case JobStarted() if (progress.last_error or "").startswith(REFUSED_BY):
            progress.last_error = None  # a pilot took it after all: the refusal is no error
        case _:
            pass
