"""The users' monitoring keys: the nkey public key each user watches the log with.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23

An API-owned auth table beside ``users`` and ``api_tokens`` (never rebuilt): one key per
user, replaced when the user registers a new one, removed with the user's tokens. Only
the public key is stored; the seed never leaves the user's machine.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "monitoring_keys",
        sa.Column(
            "user_name",
            sa.Text(),
            sa.ForeignKey("public.users.name", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("public_key", sa.Text(), nullable=False, unique=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        schema="public",
    )


def downgrade() -> None:
    op.drop_table("monitoring_keys", schema="public")
