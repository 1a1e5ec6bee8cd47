"""Read-model tables (schema ``rm``) and the API's own auth tables (schema ``public``).

Everything in ``rm`` is a fold of the log and can be rebuilt from sequence 1
(``lode projector rebuild`` builds a fresh ``rm_rebuild`` schema and swaps it
in). The migrations in ``migrations/versions`` create exactly these tables; a
test compares the two.
"""

from __future__ import annotations

from typing import Final

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

READ_SCHEMA: Final = "rm"
REBUILD_SCHEMA: Final = "rm_rebuild"

metadata = MetaData()


def _ts(name: str, *, nullable: bool = True) -> Column[object]:
    return Column(name, DateTime(timezone=True), nullable=nullable)


jobs = Table(
    "jobs",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("site", Text, nullable=False),
    Column("owner", Text, nullable=False),
    Column("app", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("workdir", Text, nullable=False),
    Column("parameters", JSONB, nullable=False),
    Column("tags", JSONB, nullable=False),
    Column("data", JSONB, nullable=False),
    Column("resources", JSONB, nullable=False),
    Column("transfers", JSONB, nullable=False),
    Column("parent_ids", ARRAY(UUID(as_uuid=True)), nullable=False),
    Column("lease_seq", BigInteger),
    Column("lease_session", UUID(as_uuid=True)),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("return_code", Integer),
    Column("last_error", Text),
    Column("created_seq", BigInteger, nullable=False),
    Column("last_seq", BigInteger, nullable=False),
    _ts("created_at", nullable=False),
    _ts("updated_at", nullable=False),
    Column("stage_times", JSONB, nullable=False),
    schema=READ_SCHEMA,
)
Index("jobs_owner_state_created", jobs.c.owner, jobs.c.state, jobs.c.created_seq.desc())
Index("jobs_owner_created", jobs.c.owner, jobs.c.created_seq.desc())
Index("jobs_site_state", jobs.c.site, jobs.c.state)
Index("jobs_app", jobs.c.site, jobs.c.app)
Index("jobs_updated", jobs.c.updated_at)
Index("jobs_tags", jobs.c.tags, postgresql_using="gin", postgresql_ops={"tags": "jsonb_path_ops"})
Index("jobs_parents", jobs.c.parent_ids, postgresql_using="gin")

job_events = Table(
    "job_events",
    metadata,
    Column("seq", BigInteger, primary_key=True, autoincrement=False),
    Column("job_id", UUID(as_uuid=True), nullable=False),
    Column("event_id", UUID(as_uuid=True), nullable=False),
    Column("site", Text, nullable=False),
    Column("type", Text, nullable=False),
    Column("from_state", Text),
    Column("to_state", Text),
    _ts("occurred_at", nullable=False),
    Column("actor", Text, nullable=False),
    Column("data", JSONB, nullable=False),
    schema=READ_SCHEMA,
)
Index("job_events_job", job_events.c.job_id, job_events.c.seq)

sites = Table(
    "sites",
    metadata,
    Column("name", Text, primary_key=True),
    Column("id", UUID(as_uuid=True), nullable=False, unique=True),
    Column("owner", Text, nullable=False),
    Column("description", Text, nullable=False, server_default=""),
    Column("public_key", Text),
    _ts("created_at", nullable=False),
    _ts("removed_at"),
    Column("last_seq", BigInteger, nullable=False),
    Column("transfer_locations", JSONB, nullable=False, server_default=text("'{}'")),
    schema=READ_SCHEMA,
)
Index("sites_owner", sites.c.owner)

apps = Table(
    "apps",
    metadata,
    Column("site", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("description", Text, nullable=False, server_default=""),
    Column("parameters", JSONB, nullable=False),
    Column("transfers", JSONB, nullable=False),
    Column("python", Boolean, nullable=False, server_default=text("false")),
    Column("hooks", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    _ts("updated_at", nullable=False),
    Column("last_seq", BigInteger, nullable=False),
    Column("version", Text, nullable=False, server_default=""),
    Column("error", Text, nullable=True),  # why its file no longer loads (app.load_failed)
    PrimaryKeyConstraint("site", "name"),
    schema=READ_SCHEMA,
)

batch_jobs = Table(
    "batch_jobs",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("site", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("scheduler_id", Text),
    Column("num_nodes", Integer, nullable=False),
    Column("wall_time_min", Integer, nullable=False),
    Column("queue", Text, nullable=False, server_default=""),
    Column("project", Text, nullable=False, server_default=""),
    Column("job_mode", Text, nullable=False),
    Column("filter_tags", JSONB, nullable=False),
    Column("exit_code", Integer),
    Column("reason", Text),
    _ts("created_at", nullable=False),
    _ts("updated_at", nullable=False),
    Column("last_seq", BigInteger, nullable=False),
    # Added by migration 0002, hence last.
    Column("scheduler", Text),  # the adapter (slurm, pbs, local, ...)
    Column("scheduler_state", Text),  # how the scheduler says it ended (walltime_expired, ...)
    Column("options", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    # Added by migration 0003: the actor of batch.requested, a user's or the site's own
    # elastic queue's (site:<site>).
    Column("requested_by", Text, nullable=False, server_default=""),
    schema=READ_SCHEMA,
)
Index("batch_jobs_site_state", batch_jobs.c.site, batch_jobs.c.state)

scalers = Table(
    "scalers",
    metadata,
    Column("site", Text, primary_key=True),
    Column("scaler_id", UUID(as_uuid=True), nullable=False),
    Column("backlog", JSONB),  # the newest scaler.backlog's data
    Column("backlog_seq", BigInteger),
    _ts("backlog_at"),
    Column("decision_seq", BigInteger),  # the newest scaler.decided
    _ts("decided_at"),
    Column("last_seq", BigInteger, nullable=False),
    schema=READ_SCHEMA,
)

scaler_decisions = Table(
    "scaler_decisions",
    metadata,
    Column("seq", BigInteger, primary_key=True, autoincrement=False),
    Column("site", Text, nullable=False),
    Column("id", UUID(as_uuid=True), nullable=False),
    _ts("decided_at", nullable=False),
    Column("backlog_id", UUID(as_uuid=True)),
    Column("queued", Integer, nullable=False),
    Column("running", Integer, nullable=False),
    Column("reason", Text, nullable=False),
    Column("requests", JSONB, nullable=False),
    Column("deletions", JSONB, nullable=False),
    Column("inputs", JSONB, nullable=False),  # backlog, windows, limits
    schema=READ_SCHEMA,
)
Index("scaler_decisions_site", scaler_decisions.c.site, scaler_decisions.c.seq.desc())

sessions = Table(
    "sessions",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("site", Text, nullable=False),
    Column("batch_job_id", UUID(as_uuid=True)),
    Column("hostname", Text, nullable=False),
    Column("mode", Text, nullable=False),
    Column("nodes", JSONB, nullable=False),
    _ts("deadline", nullable=False),
    Column("heartbeat_ttl_s", Integer, nullable=False),
    Column("state", Text, nullable=False),
    _ts("opened_at", nullable=False),
    _ts("closed_at"),
    Column("close_reason", Text),
    _ts("last_heartbeat"),
    Column("heartbeat", JSONB),
    Column("last_seq", BigInteger, nullable=False),
    schema=READ_SCHEMA,
)
Index("sessions_site_state", sessions.c.site, sessions.c.state)

transfer_items = Table(
    "transfer_items",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("site", Text, nullable=False),
    Column("job_id", UUID(as_uuid=True), nullable=False),
    Column("slot", Text, nullable=False),
    Column("direction", Text, nullable=False),
    Column("remote", JSONB, nullable=False),
    Column("local_path", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("task_id", Text),
    Column("reason", Text),
    _ts("updated_at", nullable=False),
    Column("last_seq", BigInteger, nullable=False),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("bytes_transferred", BigInteger),
    Column("duration_s", Float),
    Column("permanent", Boolean, nullable=False, server_default=text("false")),
    _ts("requested_at"),
    Column("step_id", UUID(as_uuid=True)),
    Column("cached", Boolean, nullable=False, server_default=text("false")),
    schema=READ_SCHEMA,
)
Index("transfer_items_job", transfer_items.c.job_id)
Index("transfer_items_site_state", transfer_items.c.site, transfer_items.c.state)
Index("transfer_items_step", transfer_items.c.step_id)

quarantine = Table(
    "quarantine",
    metadata,
    Column("stream", Text, nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("subject", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("raw", LargeBinary, nullable=False),
    _ts("quarantined_at", nullable=False),
    PrimaryKeyConstraint("stream", "seq"),
    schema=READ_SCHEMA,
)

projector_position = Table(
    "projector_position",
    metadata,
    Column("stream", Text, primary_key=True),
    Column("seq", BigInteger, nullable=False),
    _ts("updated_at", nullable=False),
    schema=READ_SCHEMA,
)

READ_MODEL_TABLES: Final = (
    jobs,
    job_events,
    sites,
    apps,
    batch_jobs,
    scalers,
    scaler_decisions,
    sessions,
    transfer_items,
    quarantine,
    projector_position,
)

# --- API-owned auth tables (not folds of the log; never rebuilt) -------------------------

users = Table(
    "users",
    metadata,
    Column("name", Text, primary_key=True),
    _ts("created_at", nullable=False),
    schema="public",
)

api_tokens = Table(
    "api_tokens",
    metadata,
    Column("token_hash", Text, primary_key=True),
    Column("user_name", Text, ForeignKey("public.users.name", ondelete="CASCADE"), nullable=False),
    _ts("created_at", nullable=False),
    _ts("revoked_at"),
    schema="public",
)
Index("api_tokens_user", api_tokens.c.user_name)

# One monitoring key per user (the nkey ``lode watch`` reads the log with); public key only.
monitoring_keys = Table(
    "monitoring_keys",
    metadata,
    Column(
        "user_name",
        Text,
        ForeignKey("public.users.name", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("public_key", Text, nullable=False, unique=True),
    _ts("created_at", nullable=False),
    schema="public",
)

# Every nkey public key bound to a principal: a site, a user's monitoring key. The primary key
# is what makes one key one principal: the API inserts the row in the transaction that binds
# the key, so of two requests binding the same key exactly one commits.
bound_keys = Table(
    "bound_keys",
    metadata,
    Column("public_key", Text, primary_key=True),
    Column("kind", Text, nullable=False),  # site | monitor
    Column("holder", Text, nullable=False),  # the site's name, or the user's name (monitor)
    Column("owner", Text, nullable=False),  # the user who bound it
    _ts("bound_at", nullable=False),
    CheckConstraint("kind IN ('site', 'monitor')", name="bound_keys_kind"),
    schema="public",
)
Index("bound_keys_holder", bound_keys.c.kind, bound_keys.c.holder)

# What `lode up`'s credential sync last did (one row), written by the sync, read by the API.
credential_sync = Table(
    "credential_sync",
    metadata,
    Column("id", Integer, primary_key=True),  # always 1
    Column("state", Text, nullable=False),  # ok | degraded | stuck
    Column("detail", Text, nullable=False, server_default=""),
    Column("reloads", Integer, nullable=False, server_default=text("0")),
    Column("refused", Integer, nullable=False, server_default=text("0")),
    _ts("updated_at", nullable=False),
    CheckConstraint("id = 1", name="credential_sync_one_row"),
    schema="public",
)

# The bindings the sync left out of nats-server's authorization, and why: each is a change
# that was rejected, shown to its owner (`lode site ls`, the monitoring key) and counted in
# /healthz. Rewritten by the sync; a fixed key or a removed binding leaves it.
credential_rejects = Table(
    "credential_rejects",
    metadata,
    Column("kind", Text, nullable=False),  # site | monitor
    Column("holder", Text, nullable=False),
    Column("public_key", Text, nullable=False),
    Column("reason", Text, nullable=False),
    _ts("rejected_at", nullable=False),
    PrimaryKeyConstraint("kind", "holder"),
    schema="public",
)
