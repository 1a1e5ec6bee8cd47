"""Read models (schema rm) and the API's auth tables (public.users, public.api_tokens).

Revision ID: 0001
Revises:
Create Date: 2025-11-22

Written out rather than derived from ``lodestream.infra.postgres.tables`` so that this
revision stays what it was when it shipped; tests/integration/test_migrations.py
checks that head matches the metadata. Constraint names are Postgres' own
defaults, spelled out so that every database gets the same ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RM = "rm"
UUID = pg.UUID(as_uuid=True)
TIMESTAMPTZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.execute(sa.schema.CreateSchema(RM, if_not_exists=True))
    _create_jobs()
    _create_sites_and_apps()
    _create_pilots()
    _create_transfers_and_bookkeeping()
    _create_auth()


def downgrade() -> None:
    op.drop_table("api_tokens", schema="public")
    op.drop_table("users", schema="public")
    for table in (
        "projector_position",
        "quarantine",
        "transfer_items",
        "sessions",
        "batch_jobs",
        "apps",
        "sites",
        "job_events",
        "jobs",
    ):
        op.drop_table(table, schema=RM)  # their indexes go with them
    op.execute(sa.schema.DropSchema(RM))


def _create_jobs() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", UUID, nullable=False),
        sa.Column("site", sa.Text(), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("app", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("workdir", sa.Text(), nullable=False),
        sa.Column("parameters", pg.JSONB(), nullable=False),
        sa.Column("tags", pg.JSONB(), nullable=False),
        sa.Column("data", pg.JSONB(), nullable=False),
        sa.Column("resources", pg.JSONB(), nullable=False),
        sa.Column("transfers", pg.JSONB(), nullable=False),
        sa.Column("parent_ids", pg.ARRAY(UUID), nullable=False),
        sa.Column("lease_seq", sa.BigInteger(), nullable=True),
        sa.Column("lease_session", UUID, nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("return_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_seq", sa.BigInteger(), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("created_at", TIMESTAMPTZ, nullable=False),
        sa.Column("updated_at", TIMESTAMPTZ, nullable=False),
        sa.Column("stage_times", pg.JSONB(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="jobs_pkey"),
        schema=RM,
    )
    op.create_index(
        "jobs_owner_state_created",
        "jobs",
        ["owner", "state", sa.text("created_seq DESC")],
        schema=RM,
    )
    op.create_index("jobs_owner_created", "jobs", ["owner", sa.text("created_seq DESC")], schema=RM)
    op.create_index("jobs_site_state", "jobs", ["site", "state"], schema=RM)
    op.create_index("jobs_app", "jobs", ["site", "app"], schema=RM)
    op.create_index("jobs_updated", "jobs", ["updated_at"], schema=RM)
    op.create_index(
        "jobs_tags",
        "jobs",
        ["tags"],
        schema=RM,
        postgresql_using="gin",
        postgresql_ops={"tags": "jsonb_path_ops"},
    )
    op.create_index("jobs_parents", "jobs", ["parent_ids"], schema=RM, postgresql_using="gin")

    op.create_table(
        "job_events",
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("job_id", UUID, nullable=False),
        sa.Column("event_id", UUID, nullable=False),
        sa.Column("site", sa.Text(), nullable=False),
        sa.Column("type", sa.Text(), nullable=False),
        sa.Column("from_state", sa.Text(), nullable=True),
        sa.Column("to_state", sa.Text(), nullable=True),
        sa.Column("occurred_at", TIMESTAMPTZ, nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("data", pg.JSONB(), nullable=False),
        sa.PrimaryKeyConstraint("seq", name="job_events_pkey"),
        schema=RM,
    )
    op.create_index("job_events_job", "job_events", ["job_id", "seq"], schema=RM)


def _create_sites_and_apps() -> None:
    op.create_table(
        "sites",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("id", UUID, nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False, server_default=sa.text("''")),
        sa.Column("public_key", sa.Text(), nullable=True),
        sa.Column("created_at", TIMESTAMPTZ, nullable=False),
        sa.Column("removed_at", TIMESTAMPTZ, nullable=True),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="sites_pkey"),
        sa.UniqueConstraint("id", name="sites_id_key"),
        schema=RM,
    )
    op.create_index("sites_owner", "sites", ["owner"], schema=RM)

    op.create_table(
        "apps",
        sa.Column("site", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False, server_default=sa.text("''")),
        sa.Column("parameters", pg.JSONB(), nullable=False),
        sa.Column("transfers", pg.JSONB(), nullable=False),
        sa.Column("python", sa.Boolean(), nullable=False, server_default=sa.text("false")),
        sa.Column(
            "hooks",
            pg.JSONB(astext_type=sa.Text()),
            nullable=False,
            server_default=sa.text("'[]'::jsonb"),
        ),
        sa.Column("updated_at", TIMESTAMPTZ, nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("site", "name", name="apps_pkey"),
        schema=RM,
    )


def _create_pilots() -> None:
    op.create_table(
        "batch_jobs",
        sa.Column("id", UUID, nullable=False),
        sa.Column("site", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("scheduler_id", sa.Text(), nullable=True),
        sa.Column("num_nodes", sa.Integer(), nullable=False),
        sa.Column("wall_time_min", sa.Integer(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False, server_default=sa.text("''")),
        sa.Column("project", sa.Text(), nullable=False, server_default=sa.text("''")),
        sa.Column("job_mode", sa.Text(), nullable=False),
        sa.Column("filter_tags", pg.JSONB(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("created_at", TIMESTAMPTZ, nullable=False),
        sa.Column("updated_at", TIMESTAMPTZ, nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="batch_jobs_pkey"),
        schema=RM,
    )
    op.create_index("batch_jobs_site_state", "batch_jobs", ["site", "state"], schema=RM)

    op.create_table(
        "sessions",
        sa.Column("id", UUID, nullable=False),
        sa.Column("site", sa.Text(), nullable=False),
        sa.Column("batch_job_id", UUID, nullable=True),
        sa.Column("hostname", sa.Text(), nullable=False),
        sa.Column("mode", sa.Text(), nullable=False),
        sa.Column("nodes", pg.JSONB(), nullable=False),
        sa.Column("deadline", TIMESTAMPTZ, nullable=False),
        sa.Column("heartbeat_ttl_s", sa.Integer(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("opened_at", TIMESTAMPTZ, nullable=False),
        sa.Column("closed_at", TIMESTAMPTZ, nullable=True),
        sa.Column("close_reason", sa.Text(), nullable=True),
        sa.Column("last_heartbeat", TIMESTAMPTZ, nullable=True),
        sa.Column("heartbeat", pg.JSONB(), nullable=True),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="sessions_pkey"),
        schema=RM,
    )
    op.create_index("sessions_site_state", "sessions", ["site", "state"], schema=RM)


def _create_transfers_and_bookkeeping() -> None:
    op.create_table(
        "transfer_items",
        sa.Column("id", UUID, nullable=False),
        sa.Column("site", sa.Text(), nullable=False),
        sa.Column("job_id", UUID, nullable=False),
        sa.Column("slot", sa.Text(), nullable=False),
        sa.Column("direction", sa.Text(), nullable=False),
        sa.Column("remote", pg.JSONB(), nullable=False),
        sa.Column("local_path", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("task_id", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("updated_at", TIMESTAMPTZ, nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="transfer_items_pkey"),
        schema=RM,
    )
    op.create_index("transfer_items_job", "transfer_items", ["job_id"], schema=RM)

    op.create_table(
        "quarantine",
        sa.Column("stream", sa.Text(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("raw", sa.LargeBinary(), nullable=False),
        sa.Column("quarantined_at", TIMESTAMPTZ, nullable=False),
        sa.PrimaryKeyConstraint("stream", "seq", name="quarantine_pkey"),
        schema=RM,
    )

    op.create_table(
        "projector_position",
        sa.Column("stream", sa.Text(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", TIMESTAMPTZ, nullable=False),
        sa.PrimaryKeyConstraint("stream", name="projector_position_pkey"),
        schema=RM,
    )


def _create_auth() -> None:
    op.create_table(
        "users",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("created_at", TIMESTAMPTZ, nullable=False),
        sa.PrimaryKeyConstraint("name", name="users_pkey"),
        schema="public",
    )
    op.create_table(
        "api_tokens",
        sa.Column("token_hash", sa.Text(), nullable=False),
        sa.Column("user_name", sa.Text(), nullable=False),
        sa.Column("created_at", TIMESTAMPTZ, nullable=False),
        sa.Column("revoked_at", TIMESTAMPTZ, nullable=True),
        sa.PrimaryKeyConstraint("token_hash", name="api_tokens_pkey"),
        sa.ForeignKeyConstraint(
            ["user_name"],
            ["public.users.name"],
            name="api_tokens_user_name_fkey",
            ondelete="CASCADE",
        ),
        schema="public",
    )
    op.create_index("api_tokens_user", "api_tokens", ["user_name"], schema="public")
