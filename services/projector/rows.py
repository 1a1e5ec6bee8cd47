"""Row shapes of the read models, built from events by named constructors.

The live projector and the rebuild both go through these, which is what
makes ``rebuild == live`` hold row for row.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from lodestream.schemas.events.job import JobCreated
from lodestream.schemas.fold import JobView
from lodestream.schemas.states import JobState

# Column order of the COPY into rm.jobs; must match JobRecord.to_copy().
JOB_COLUMNS = (
    "id", "site", "owner", "app", "state", "workdir", "parameters", "tags", "data",
    "resources", "transfers", "parent_ids", "lease_seq", "lease_session", "attempts",
    "return_code", "last_error", "created_seq", "last_seq", "created_at", "updated_at",
    "stage_times",
)  # fmt: skip
PROGRESS_COLUMNS = (
    "id", "state", "lease_seq", "lease_session", "attempts", "return_code", "last_error",
    "last_seq", "updated_at", "stage_times",
)  # fmt: skip
JOB_EVENT_COLUMNS = (
    "seq", "job_id", "event_id", "site", "type", "from_state", "to_state", "occurred_at",
    "actor", "data",
)  # fmt: skip

# The Postgres types of those columns, in the same order, for binary COPY: the server
# reads each value with its type's binary input, so these must be the columns' exact
# types (an int8 sent for an int4 column is refused). The migration's types.
JOB_COPY_TYPES = (
    "uuid", "text", "text", "text", "text", "text", "jsonb", "jsonb", "jsonb", "jsonb", "jsonb",
    "uuid[]", "int8", "uuid", "int4", "int4", "text", "int8", "int8", "timestamptz",
    "timestamptz", "jsonb",
)  # fmt: skip
# The progress columns' types: the arrays a batch's progress rows are passed in (store.py).
PROGRESS_TYPES = (
    "uuid", "text", "int8", "uuid", "int4", "int4", "text", "int8", "timestamptz", "jsonb",
)  # fmt: skip
JOB_EVENT_COPY_TYPES = (
    "int8", "uuid", "uuid", "text", "text", "text", "text", "timestamptz", "text", "jsonb",
)  # fmt: skip

_RESOURCE_FIELDS = (
    "num_nodes", "ranks_per_node", "threads_per_rank", "threads_per_core", "gpus_per_rank",
    "node_packing_count", "launch_params", "wall_time_min",
)  # fmt: skip


def jsonb(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


@dataclass(slots=True)
class JobProgress:
    """The columns of a job that change after creation."""

    view: JobView
    return_code: int | None = None
    last_error: str | None = None

    @property
    def updated_at(self) -> datetime:
        assert self.view.updated_at is not None
        return self.view.updated_at

    def stage_times_json(self) -> str:
        # orjson writes an aware datetime as isoformat() does (validated events carry
        # whole-minute offsets), ten times faster; jsonb keeps keys in its own order anyway.
        return orjson.dumps(self.view.stage_times).decode()

    def to_copy(self) -> tuple[Any, ...]:
        v = self.view
        return (
            v.id, v.state.value, v.lease_seq, v.lease_session, v.attempts, self.return_code,
            self.last_error, v.last_seq, self.updated_at, self.stage_times_json(),
        )  # fmt: skip

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> JobProgress:
        """From ``SELECT id, site, <PROGRESS_COLUMNS[1:]>``."""
        (job_id, site, state, lease_seq, lease_session, attempts, return_code, last_error,
         last_seq, updated_at, stage_times) = row  # fmt: skip
        view = JobView(
            id=job_id,
            site=site,
            state=JobState(state),
            last_seq=last_seq,
            lease_seq=lease_seq,
            lease_session=lease_session,
            attempts=attempts,
            stage_times={k: datetime.fromisoformat(v) for k, v in stage_times.items()},
            updated_at=updated_at,
        )
        return cls(view=view, return_code=return_code, last_error=last_error)


@dataclass(slots=True)
class JobRecord:
    """A job first seen in this batch: its immutable columns plus progress."""

    created: JobCreated
    created_seq: int
    owner: str
    progress: JobProgress

    @property
    def id(self) -> uuid.UUID:
        return self.created.aggregate_id

    def to_copy(self) -> tuple[Any, ...]:
        spec = self.created.data
        p = self.progress
        resources = {name: getattr(spec, name) for name in _RESOURCE_FIELDS}
        return (
            self.id, spec.site, self.owner, spec.app, p.view.state.value, spec.workdir,
            jsonb(spec.parameters), jsonb(spec.tags), jsonb(spec.data), jsonb(resources),
            jsonb({k: v.model_dump(mode="json") for k, v in spec.transfers.items()}),
            list(spec.parent_ids), p.view.lease_seq, p.view.lease_session, p.view.attempts,
            p.return_code, p.last_error, self.created_seq, p.view.last_seq,
            self.created.occurred_at, p.updated_at, p.stage_times_json(),
        )  # fmt: skip


# Not frozen: a frozen dataclass sets each field through object.__setattr__, four times
# the cost of a plain one, and one of these is made for every job event folded.
@dataclass(slots=True)
class JobEventRow:
    seq: int
    job_id: uuid.UUID
    event_id: uuid.UUID
    site: str
    type: str
    from_state: str | None
    to_state: str | None
    occurred_at: datetime
    actor: str
    data: str

    def to_copy(self) -> tuple[Any, ...]:
        return (
            self.seq, self.job_id, self.event_id, self.site, self.type, self.from_state,
            self.to_state, self.occurred_at, self.actor, self.data,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class QuarantineRow:
    stream: str
    seq: int
    subject: str
    reason: str
    raw: bytes

    def __post_init__(self) -> None:
        # The subject and the reason (which may quote the payload) are text columns, and
        # Postgres text cannot hold NUL: a quarantine row must never be unstorable itself.
        object.__setattr__(self, "subject", self.subject.replace("\x00", "\\u0000"))
        object.__setattr__(self, "reason", self.reason.replace("\x00", "\\u0000"))
