"""Batch jobs record their scheduler, how it says they ended, and the options asked for.

Revision ID: 0002
Revises: 0001
Create Date: 2025-12-08
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RM = "rm"


def upgrade() -> None:
    op.add_column("batch_jobs", sa.Column("scheduler", sa.Text(), nullable=True), schema=RM)
    op.add_column("batch_jobs", sa.Column("scheduler_state", sa.Text(), nullable=True), schema=RM)
    op.add_column(
        "batch_jobs",
        sa.Column("options", pg.JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
        schema=RM,
    )


def downgrade() -> None:
    for column in ("options", "scheduler_state", "scheduler"):
        op.drop_column("batch_jobs", column, schema=RM)
