"""The elastic queue: who requested each batch job, the scalers and their decisions.

Revision ID: 0003
Revises: 0002
Create Date: 2026-02-01

``rm.batch_jobs.requested_by`` tells the batch jobs a site's elastic queue requested (and may
delete) from a user's. ``rm.scalers`` holds each site's newest backlog and decision,
``rm.scaler_decisions`` every decision with its inputs. All are folds of the log: existing
deployments get them filled by ``lode projector rebuild`` (batch jobs projected before this
revision read ``requested_by`` as '' until then, which the elastic queue treats as a user's).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RM = "rm"
UUID = pg.UUID(as_uuid=True)
TIMESTAMPTZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column(
        "batch_jobs",
        sa.Column("requested_by", sa.Text(), nullable=False, server_default=sa.text("''")),
        schema=RM,
    )
    op.create_table(
        "scalers",
        sa.Column("site", sa.Text(), nullable=False),
        sa.Column("scaler_id", UUID, nullable=False),
        sa.Column("backlog", pg.JSONB(), nullable=True),
        sa.Column("backlog_seq", sa.BigInteger(), nullable=True),
        sa.Column("backlog_at", TIMESTAMPTZ, nullable=True),
        sa.Column("decision_seq", sa.BigInteger(), nullable=True),
        sa.Column("decided_at", TIMESTAMPTZ, nullable=True),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("site", name="scalers_pkey"),
        schema=RM,
    )
    op.create_table(
        "scaler_decisions",
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("site", sa.Text(), nullable=False),
        sa.Column("id", UUID, nullable=False),
        sa.Column("decided_at", TIMESTAMPTZ, nullable=False),
        sa.Column("backlog_id", UUID, nullable=True),
        sa.Column("queued", sa.Integer(), nullable=False),
        sa.Column("running", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("requests", pg.JSONB(), nullable=False),
        sa.Column("deletions", pg.JSONB(), nullable=False),
        sa.Column("inputs", pg.JSONB(), nullable=False),
        sa.PrimaryKeyConstraint("seq", name="scaler_decisions_pkey"),
        schema=RM,
    )
    op.create_index(
        "scaler_decisions_site",
        "scaler_decisions",
        ["site", sa.text("seq DESC")],
        schema=RM,
    )


def downgrade() -> None:
    op.drop_table("scaler_decisions", schema=RM)  # its index goes with it
    op.drop_table("scalers", schema=RM)
    op.drop_column("batch_jobs", "requested_by", schema=RM)
